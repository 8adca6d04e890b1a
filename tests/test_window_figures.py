"""Every figure in a finding is measured in the window the header names (issue 32): on every shipped sample, the
counts in the layout, pageable-copy and data-loader findings against plain SQL restricted to that window (the
steady steps' span, or the steps themselves for copies), never the whole trace.
"""

from __future__ import annotations

import re
import sqlite3

import pytest
from conftest import SAMPLES, sample_analysis

from nvtx_trace.analyzer.measures.kernel_kinds import TRANSPOSE_RE

REPORTS = sorted(p for p in SAMPLES.glob("*.sqlite"))


def rows(path, sql, *params):
    with sqlite3.connect(path) as db:
        return db.execute(sql, params).fetchall()


def kernels_by_name(path, lo, hi) -> list[tuple[str, int]]:
    """(short name, duration) of every kernel that starts in [lo, hi)."""
    return rows(path, "SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                      "ON s.id = k.shortName WHERE k.start >= ? AND k.start < ?", lo, hi)


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.stem)
def test_finding_counts_are_the_window_s(report):
    a = sample_analysis(report)
    lo, hi = a.window["start_ns"], a.window["end_ns"]
    checked = 0
    for f in a.findings:
        if f.kind == "layout_transpose":
            found = [d for name, d in kernels_by_name(report, lo, hi) if TRANSPOSE_RE.search(name)]
            assert f.title.startswith(f"{len(found)} NCHW<->NHWC transpose kernels took")
            assert f.impact_ns == sum(found)
            checked += 1
        elif f.kind == "pageable_h2d":
            (pageable,) = rows(report, "SELECT id FROM ENUM_CUDA_MEM_KIND WHERE name LIKE '%PAGEABLE%'")[0]
            steady = a.steps.steady
            copies = rows(report, "SELECT start FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 AND srcKind = ?",
                          pageable)
            inside = sum(any(s <= c < e for s, e in zip(steady["start_ns"], steady["end_ns"])) for (c,) in copies)
            assert f.title.startswith(f"{inside} host-to-device copies from pageable memory inside the steady steps")
            checked += 1
        elif f.kind == "dataloader_stall" and "median wait" in f.title:
            loader = re.search(r"; loader (.+?): median wait", f.title).group(1)
            waits = rows(report, "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                 "WHERE coalesce(s.value, e.text) = ? AND e.start >= ? AND e.start < ?",
                         f"dataloader.next [{loader}]", lo, hi)[0][0]
            if waits:  # nvtx_autotrace's ranges (a user's own loader ranges are named by --loader-pattern)
                assert re.search(rf"median wait [\d.]+ [mµ]?s over {waits} batch(es)?$", f.title.split("; and")[0])
                checked += 1
    if report.stem in ("resnet_flawed_user", "resnet_flawed", "resnet50_2workers_h100"):
        assert checked >= 2  # samples known to hold these findings: the test must not pass by finding none
