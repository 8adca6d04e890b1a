"""The H100 exports captured with `nvtx-trace run` (nvtx_autotrace ranges), checked with plain SQL.

These prove the two halves agree: the ranges nvtx_autotrace writes on a real GPU
(pinned/pageable copy labels, module backward ranges on the autograd thread)
match what CUPTI recorded, and the analyzer's attribution matches an
independent SQL containment query.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from nvtx_trace import names
from nvtx_trace.analyzer import analyze

SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"
def launches(result) -> str:
    """The transposes' launches, by SQL, among the kernels that start in the analysis's steady window (where
    the layout figures are measured: issue 32)."""
    lo, hi = int(result.window["start_ns"]), int(result.window["end_ns"])
    return f"""
    SELECT r.start AS t, r.globalTid AS g FROM CUPTI_ACTIVITY_KIND_KERNEL k
    JOIN StringIds s ON s.id = k.shortName
    JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid & ~16777215) = k.globalPid
    WHERE (s.value LIKE 'nchwToNhwc%' OR s.value LIKE 'nhwcToNchw%') AND k.start >= {lo} AND k.start < {hi}"""


def _open(name):
    path = SAMPLES / name
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return path, conn, analyze(path)


@pytest.fixture(scope="module", params=["resnet_flawed.sqlite", "resnet_fixed.sqlite"])
def report(request):
    opened = _open(request.param)
    yield opened
    opened[1].close()


@pytest.fixture(scope="module")
def flawed():
    opened = _open("resnet_flawed.sqlite")
    yield opened
    opened[1].close()


@pytest.fixture(scope="module")
def fixed():
    opened = _open("resnet_fixed.sqlite")
    yield opened
    opened[1].close()


def test_transposes_are_attributed_to_the_same_modules_as_a_sql_containment_query(report):
    path, conn, result = report
    # Independent: for each launch, the latest-started module range on the launching thread containing it.
    rows = conn.execute(f"""
        WITH l AS ({launches(result)})
        SELECT (SELECT sn.value FROM NVTX_EVENTS n JOIN StringIds sn ON sn.id = n.textId
                WHERE n.globalTid = l.g AND n.start <= l.t AND n.end >= l.t
                  AND (sn.value LIKE 'forward %' OR sn.value LIKE 'backward %')
                ORDER BY n.start DESC LIMIT 1) AS m, count(*)
        FROM l GROUP BY m""").fetchall()
    expected = Counter()
    for name, n in rows:
        if name is None:
            expected[("(no enclosing range)", None)] += n
            continue
        m = names.MODULE_RE.match(name)
        label = f"{m.group('path')} ({m.group('cls')})" if m.group("path") else f"({m.group('cls')})"
        expected[(label, m.group("phase"))] += n
    got = Counter()
    for r in result.layout.by_module.itertuples():
        key = (r.module, None if r.module == "(no enclosing range)" else r.phase)
        got[key] += int(r.count) - int(r.via_fallback)
    assert got == +expected
    assert sum(expected.values()) == result.layout.count


def test_flawed_backward_transposes_land_in_module_backward_ranges_on_the_autograd_thread(flawed):
    path, conn, result = flawed
    (on_autograd,), = conn.execute(f"""
        WITH l AS ({launches(result)}) SELECT count(*) FROM l JOIN ThreadNames t ON t.globalTid = l.g
        JOIN StringIds tn ON tn.id = t.nameId WHERE tn.value LIKE 'pt_autograd%'""").fetchall()
    backward = result.layout.by_module[result.layout.by_module["phase"] == "backward"]
    assert on_autograd > 1000
    named = backward[backward["module"] != "(no enclosing range)"]["count"].sum()
    assert named >= 0.95 * on_autograd  # per-module backward ranges cover the autograd thread's launches


def test_autotrace_copy_labels_agree_with_cuptis_memory_kind(report):
    _, conn, _ = report
    rows = conn.execute("""
        SELECT sn.value, k.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
        JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind AND o.label = 'Host-to-Device'
        JOIN ENUM_CUDA_MEM_KIND k ON k.id = m.srcKind
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
             AND (r.globalTid & ~16777215) = m.globalPid
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND n.end >= r.end
        JOIN StringIds sn ON sn.id = n.textId AND sn.value LIKE 'copy.h2d %'
        GROUP BY 1, 2""").fetchall()
    assert rows, "no host-to-device copy ran inside a copy.h2d range"
    for name, kind, _ in rows:
        assert names.H2D_COPY_RE.match(name).group("kind") == kind.lower(), (name, kind)


def test_flawed_run_has_host_sync_ranges_around_blocking_cuda_calls(flawed):
    path, conn, result = flawed
    (n,), = conn.execute("""
        SELECT count(*) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId AND s.value = 'sync item'
        WHERE EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds rn ON rn.id = r.nameId
                      WHERE r.globalTid = n.globalTid AND r.start >= n.start AND r.end <= n.end
                        AND (rn.value LIKE 'cudaStreamSynchronize%' OR rn.value LIKE 'cudaMemcpy%'))""").fetchall()
    assert n >= 30
    assert {"dataloader_stall", "pageable_h2d", "layout_transpose"} <= {f.kind for f in result.findings}


def test_fixed_run_findings_differ_as_expected(fixed):
    path, _, result = fixed
    kinds = {f.kind for f in result.findings}
    assert not ({"dataloader_stall", "pageable_h2d", "layout_transpose"} & kinds)
    assert result.loader.loaders["workers"].max() >= 8  # worker fetch ranges under each worker pid
