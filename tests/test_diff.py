"""`nvtx-trace diff`: the flawed and the fixed sample runs, against plain SQL medians of their step ranges."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

SAMPLES = ROOT / "sample_reports"
BEFORE, AFTER = SAMPLES / "resnet_flawed.sqlite", SAMPLES / "resnet_fixed.sqlite"


def steady_median_sql(path, warmup: int, keep: int) -> float:
    with sqlite3.connect(path) as db:
        d = [r[0] for r in db.execute("SELECT e.end - e.start FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                                      "WHERE s.value GLOB 'step [0-9]*' ORDER BY e.start")]
    return float(np.median(d[warmup:keep]))


@pytest.fixture(scope="module")
def diffed(tmp_path_factory):
    out = tmp_path_factory.mktemp("diff") / "d.json"
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "diff", str(BEFORE), str(AFTER), "--json", str(out),
                           "--html", str(out.with_suffix(".html"))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout, out.with_suffix(".html")


def test_diff_medians_equal_sql_medians_of_the_step_ranges(diffed):
    from nvtx_trace.analyzer import analyze

    d, _, _ = diffed
    for side, path in (("before", BEFORE), ("after", AFTER)):
        steps = analyze(path).steps
        sql = steady_median_sql(path, steps.warmup_steps, len(steps.table))
        assert d[side]["step_ns_median"] == pytest.approx(sql, rel=0.02)
    assert d["speedup"] == pytest.approx(d["before"]["step_ns_median"] / d["after"]["step_ns_median"])


def test_diff_says_what_was_resolved_and_what_is_new(diffed):
    d, text, html = diffed
    status = {(f["kind"], f["cause"]): f["status"] for f in d["findings"]}
    assert status[("dataloader_stall", None)] == "resolved" and status[("layout_transpose", None)] == "resolved"
    assert "new" in status.values()  # launch-bound once the loader keeps up: the next thing to fix
    stall = next(f for f in d["findings"] if f["kind"] == "dataloader_stall")
    assert stall["predicted_step_ns"] > 0 and stall["measured_step_ns"] == d["after"]["step_ns_median"]
    # the statistic the prediction is checked in is named, beside the head's own (issue 52, item 18)
    assert stall["prediction_statistic"] == "median" and "(median, " in text
    assert "faster" in text and "resolved" in text and "resolved" in html.read_text()


def test_diff_of_a_folder_without_a_report_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "diff", str(tmp_path), str(AFTER)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "summary.json" in proc.stderr


def test_diff_of_two_per_rank_run_folders_analyzes_each_folders_ranks_together(tmp_path):
    """What run --per-rank leaves (rank0.sqlite, rank1.sqlite, no summary.json when writing it failed):
    each folder is one merged analysis, and the same run on both sides changes nothing."""
    import shutil

    from nvtx_trace.runner import diff as diff_mod

    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        for r in (0, 1):
            shutil.copy(ROOT / "sample_reports" / f"ddp_per_rank_window_rank{r}_h200x2.sqlite",
                        tmp_path / side / f"rank{r}.sqlite")
    d = diff_mod.compare(diff_mod.load_summary(tmp_path / "a"), diff_mod.load_summary(tmp_path / "b"))
    assert d["speedup"] == 1.0 and {f["status"] for f in d["findings"]} == {"unchanged"}
    assert "straggler" in {f["kind"] for f in d["findings"]} and d["step_statistic"] == "mean"
