"""The advice loop on a real pair of H100 runs (sample_reports/README.md): an ImageNet-style ResNet-50 with
real CPU transforms and 2 DataLoader workers, then the same program with the worker count the first run
advised. The advice, its predicted step and the diff are checked against what the second run measured
and against plain SQL over the step ranges.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from nvtx_trace.analyzer import analyze

SAMPLES = ROOT / "sample_reports"
BEFORE, AFTER = SAMPLES / "resnet50_2workers_h100.sqlite", SAMPLES / "resnet50_8workers_h100.sqlite"


def step_durations_sql(path, warmup: int) -> np.ndarray:
    """Durations of the `step N` ranges that hold an optimizer step (the last one, where the loader ran
    dry, does not), after the warm-up, by SQL alone."""
    return np.array([e - s for s, e in step_spans_sql(path, warmup)], dtype=np.float64)


def step_spans_sql(path, warmup: int) -> list[tuple[int, int]]:
    """(start, end) of those steps."""
    with sqlite3.connect(path) as db:
        d = [(r[0], r[1]) for r in db.execute("""
            WITH named AS (SELECT e.start, e.end, s.value AS name FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
                           WHERE s.value GLOB 'step [0-9]*' OR s.value GLOB 'optimizer.step *'),
                 opt AS (SELECT start, end FROM named WHERE name GLOB 'optimizer.step *')
            SELECT st.start, st.end FROM named st WHERE st.name GLOB 'step [0-9]*'
              AND EXISTS (SELECT 1 FROM opt WHERE opt.start >= st.start AND opt.end <= st.end)
            ORDER BY st.start""")]
    return d[warmup:]


def pageable_copies_sql(path) -> tuple[int, int]:
    """Host-to-device copies from pageable memory: (in the whole trace, inside a `step N` range)."""
    with sqlite3.connect(path) as db:
        return db.execute("""
            WITH steps AS (SELECT e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
                           WHERE s.value GLOB 'step [0-9]*')
            SELECT count(*), coalesce(sum(EXISTS (SELECT 1 FROM steps WHERE m.start BETWEEN steps.start AND steps.end)), 0)
            FROM CUPTI_ACTIVITY_KIND_MEMCPY m WHERE m.copyKind = 1 AND m.srcKind = 0""").fetchone()


@pytest.fixture(scope="module")
def after():
    return analyze(AFTER)


@pytest.fixture(scope="module")
def before():
    a = analyze(BEFORE)
    return a, next(f for f in a.findings if f.kind == "dataloader_stall")


def test_advice_is_within_the_machine_and_offers_no_fix_already_in_place(before):
    a, stall = before
    # 8 workers keep up (the second run confirms it), each slowed by the others (dataloader.CONTENTION)
    assert a.cpu_cores == 16 and stall.recommend == {"num_workers": 8}
    everywhere, in_steps = pageable_copies_sql(BEFORE)
    assert everywhere > 0 and in_steps == 0  # the model's one-time upload only: batches come pinned
    assert "pin_memory" not in stall.fix and not any(f.kind == "pageable_h2d" for f in a.findings)


def test_the_prediction_survives_the_fix(before, after):
    """The second run followed the advice (8 workers); its steady step, by SQL, against the prediction."""
    a, stall = before
    measured = float(np.median(step_durations_sql(AFTER, after.steps.warmup_steps)))
    predicted = stall.predicted["step_ns"]
    assert abs(predicted - measured) / measured <= 0.25
    assert predicted == stall.evidence["compute_ns_per_step"]  # bound by compute, never faster
    assert not any(f.kind == "dataloader_stall" for f in after.findings)


def test_alternating_steps_are_two_kinds_and_compared_by_their_mean(before):
    """Two workers deliver in pairs: steps alternate ~70 ms / ~350 ms, and a median hides that."""
    a, stall = before
    summary = a.steps.summary()
    sql = step_durations_sql(BEFORE, a.steps.warmup_steps)
    assert summary["step_ns_mean"] == pytest.approx(sql.mean(), rel=0.01)
    modes = summary["modes"]
    assert modes and modes["high_ns"] > 4 * modes["low_ns"] and modes["low_steps"] + modes["high_steps"] == len(sql)
    assert stall.predicted["step_ns"] + stall.predicted["saving_ns"] == summary["step_ns_mean"]


def test_diff_shows_the_stall_resolved_and_the_prediction_beside_the_measurement(tmp_path, before, after):
    out = tmp_path / "d.json"
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "diff", str(BEFORE), str(AFTER), "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(out.read_text())
    stall = next(f for f in d["findings"] if f["kind"] == "dataloader_stall")
    assert stall["status"] == "resolved" and abs(stall["prediction_error"]) <= 0.25
    assert d["step_statistic"] == "mean"  # the before-run's steps come in two kinds
    b, a = before[0].steps, after.steps
    assert d["before"]["step_ns_mean"] == pytest.approx(step_durations_sql(BEFORE, b.warmup_steps).mean(), rel=0.02)
    assert d["after"]["step_ns_median"] == pytest.approx(np.median(step_durations_sql(AFTER, a.warmup_steps)), rel=0.02)
    assert d["speedup"] == pytest.approx(d["before"]["step_ns_mean"] / d["after"]["step_ns_mean"])
    assert "Steady step (mean)" in proc.stdout and "resolved" in proc.stdout


def transpose_ns_per_step_sql(path, names: str = "s.value IN ('nchwToNhwcKernel', 'nhwcToNchwKernel')",
                              warmup: int = 0) -> float:
    """cuDNN's layout-conversion kernels (nchwToNhwc / nhwcToNchw) per steady `step N` range (after ``warmup``
    steps), counting those that start between the first steady step's start and the last one's end, by SQL."""
    spans = step_spans_sql(path, warmup)
    lo, hi = spans[0][0], max(e for _, e in spans)
    with sqlite3.connect(path) as db:
        (total,) = db.execute("SELECT coalesce(sum(k.end - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN "
                              f"StringIds s ON s.id = k.shortName WHERE ({names}) AND k.start >= ? AND k.start < ?",
                              (lo, hi)).fetchone()
    return total / len(spans)


def test_every_prediction_is_the_step_now_less_a_measured_part(before, after):
    """On the GPU-bound after-run, channels_last is predicted to save the transposes' time per step and a third
    of cuDNN's NCHW batch norm (1 - 1/1.49: its NHWC kernels measured 1.49x faster), both by SQL; this fp32
    run has none of PyTorch's own NCHW batch-norm kernels (bf16 runs them)."""
    layout = next(f for f in after.findings if f.kind == "layout_transpose")
    now = float(np.median(step_durations_sql(AFTER, after.steps.warmup_steps)))
    warm = after.steps.warmup_steps
    batchnorm = transpose_ns_per_step_sql(AFTER, "s.value GLOB 'bn_fw_*' OR s.value GLOB 'bn_bw_*'", warm)
    assert batchnorm > 0 and transpose_ns_per_step_sql(AFTER, "s.value GLOB 'batch_norm_*'", warm) == 0
    expected = transpose_ns_per_step_sql(AFTER, warmup=warm) + batchnorm * (1 - 1 / 1.49)
    assert layout.predicted["saving_ns"] == pytest.approx(expected, rel=0.01)
    assert layout.predicted["step_ns"] + layout.predicted["saving_ns"] == pytest.approx(now, rel=0.02)
    assert "Expected: step" in layout.fix
    for a in (before[0], after):
        for f in a.findings:
            p = f.predicted
            assert p is None or 0 < p["step_ns"] and p["saving_ns"] >= 0
