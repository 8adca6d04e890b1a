"""A GPU-side fix on a partly idle GPU (issue 41, item 6): predicted when the GPU's idle time is in gaps of 1 ms or
more (serial host work that stays), withheld and said when launches that cannot keep up leave it idle in short
gaps. The short-gap idle per step is cross-checked here by SQL over the report's own GPU tables (a window
function over kernels, copies and memsets, clipped to the analysis window), not by the analyzer's intervals."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from conftest import sample_analysis

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.summary import to_dict

SAMPLES = Path(__file__).resolve().parents[1] / "sample_reports"


def short_gap_idle_sql(path: Path, device_id: int, w0: int, w1: int, min_gap: int) -> int:
    """Idle between consecutive GPU operations (by running max of ends) shorter than ``min_gap``, inside [w0, w1)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("""
            WITH ops AS (
                SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?1 AND start > 0
                UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?1 AND start > 0
                UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?1 AND start > 0),
            ordered AS (
                SELECT start, MAX(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                       AS reach FROM ops)
            SELECT SUM(MIN(start, ?3) - MAX(reach, ?2)) FROM ordered
            WHERE reach IS NOT NULL AND start > reach AND start - reach < ?4 AND start > ?2 AND reach < ?3""",
                            (device_id, w0, w1, min_gap)).fetchall()
    finally:
        conn.close()
    return int(rows[0][0] or 0)


def test_a_launch_bound_step_gets_no_gpu_side_prediction_and_says_how_much_is_launches():
    path = SAMPLES / "resnet_fixed_user.sqlite"
    a = sample_analysis(path)
    steps = len(a.steps.steady)
    by_sql = short_gap_idle_sql(path, 0, a.window["start_ns"], a.window["end_ns"], a.min_gap_ns) / steps
    assert predict.launch_gaps_per_step(a) == pytest.approx(by_sql, rel=0.01)
    now, _ = predict.steady_step(a)
    assert by_sql > predict.LAUNCH_BOUND_SHARE * now  # launch-bound by the independent count
    summary = to_dict(a)
    fusion = next(f for f in summary["findings"] if f["kind"] == "fusion")
    assert fusion["predicted"] is None
    said = re.search(r"idles (\d+) % of it in gaps under 1.00 ms while the host launches", fusion["fix"])
    assert said and int(said.group(1)) == round(by_sql / now * 100)


def test_a_gpu_idle_in_long_gaps_gets_its_prediction_bounded_by_the_loader():
    """ResNet-50 with 2 workers on an H100: 35 % busy, its idle nearly all in long waits for batches: the
    precision fix is predicted (no longer withheld) and, the loader setting the pace, saves nothing until the
    loader is fixed, as its words say."""
    path = SAMPLES / "resnet50_2workers_h100.sqlite"
    a = sample_analysis(path)
    steps = len(a.steps.steady)
    now, _ = predict.steady_step(a)
    by_sql = short_gap_idle_sql(path, a.idle.devices[0].device_id, a.window["start_ns"], a.window["end_ns"],
                                a.min_gap_ns) / steps
    assert by_sql < predict.LAUNCH_BOUND_SHARE * now
    assert a.steps.summary()["gpu_busy_fraction"] < predict.GPU_BOUND
    summary = to_dict(a)
    precision = next(f for f in summary["findings"] if f["kind"] == "precision")
    assert precision["predicted"]["bound_by"] == "loader" and precision["predicted"]["saving_ns"] == 0
    assert "fix the loader first" in precision["fix"]
