"""The loader falling behind, on a real capture here: `nvtx-trace run` profiles steps 2-11 of a loop whose
two workers filled a deep queue (prefetch_factor=12) during a 4 s head start, as a long warm-up does;
each batch takes them about 80 ms (samples wait, as on slow storage), each step about 8 ms of CPU work.
In the window the loop eats the queue; the finding must say that steps will slow to the workers' pace.
Checked independently: the pace against SQL over the workers' fetch ranges, the step against SQL.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from test_run import ready  # noqa: F401  (fixture: nsys, torch, a recorded nvtx)

SCRIPT = ROOT / "programs" / "slow_loader_train.py"


@pytest.fixture(scope="module")
def run(ready, tmp_path_factory):  # noqa: F811
    work = tmp_path_factory.mktemp("behind")
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_trace.cli", "run", "--out", "out", "--warmup-steps", "2", "--steps", "10",
         str(SCRIPT), "--steps", "40", "--workers", "2", "--work-ms", "20", "--prefetch", "12",
         "--head-start-s", "4", "--step-ms", "5", "--sleep-fetch"],
        cwd=work, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return work / "out", done.stdout


def test_the_finding_projects_the_workers_pace_and_it_matches_sql(run):
    out, printed = run
    summary = json.loads((out / "summary.json").read_text())
    f = next(f for f in summary["findings"] if f["kind"] == "dataloader_stall")
    behind = f["evidence"]["falls_behind"]
    assert behind is not None, (summary["steps"]["summary"], f["title"])
    with sqlite3.connect(f"file:{out / 'report.sqlite'}?mode=ro", uri=True) as db:
        spans = lambda like: np.array(db.execute(  # noqa: E731
            "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            f"WHERE COALESCE(s.value, e.text) LIKE '{like}%' AND e.end IS NOT NULL").fetchall(), dtype=np.int64)
        fetch, steps = spans("dataloader.fetch"), spans("step ")
    assert behind["delivery_ns"] == int(np.median(fetch[:, 1] - fetch[:, 0]) / 2)  # 2 workers
    window = summary["window"]
    middle = steps.sum(axis=1) // 2
    inside = steps[(middle >= window["start_ns"]) & (middle < window["end_ns"])]
    durations = inside[:, 1] - inside[:, 0]
    # the typical step the summary names: the median, or the mean when stalls make it the throughput's
    # (the VM's scheduling once gave 8-27 ms steps: median 10.3 ms, mean 12.5 ms, statistic "mean")
    statistic = summary["steps"]["summary"]["statistic"]
    assert behind["step_ns"] == int({"median": np.median, "mean": np.mean}[statistic](durations)), statistic
    assert behind["delivery_ns"] > 2 * behind["step_ns"]  # about 40 ms against about 8 ms
    assert behind["batches_taken"] > behind["batches_delivered"]
    assert "steps will slow to about" in printed or "The loader falls behind" in printed


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_loop_that_loads_its_own_batches_is_told_how_many_workers_within_the_cpus_it_may_use(tmp_path):
    """num_workers=0, one CPU allowed (taskset), samples that wait 5 ms (I/O): the finding names a worker count
    and predicts a step; the CPU share it sizes them by is the one an independent SQL over the export finds
    (each batch's `dataloader.cpu` time over the wait that holds it, the median over batches); the settings
    record says 1 CPU allowed."""
    import shutil
    import sqlite3

    from conftest import installed_nsys

    installed_nsys()
    if not shutil.which("taskset"):
        pytest.skip("taskset not installed")
    from conftest import again_after_nsys_fault

    out = tmp_path / "run"
    proc = again_after_nsys_fault(lambda: subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "nvtx_trace.cli", "run", "--no-history", "--out", str(out),
         str(ROOT / "programs" / "slow_loader_train.py"), "--workers", "0", "--sleep-fetch", "--work-ms", "5",
         "--batch", "4", "--step-ms", "2", "--steps", "3000"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL), clear=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((out / "summary.json").read_text())
    assert d["settings"]["cpus_allowed"] == 1 and d["settings"]["cpus_host"] == os.cpu_count()
    stall = next(f for f in d["findings"] if f["kind"] == "dataloader_stall")
    assert stall["recommend"]["num_workers"] >= 2 and stall["predicted"]["step_ns"] < d["steps"]["summary"][
        "step_ns_" + stall["predicted"]["statistic"]]
    assert "now 0: the training loop loads each batch itself" in stall["fix"]
    if os.cpu_count() > 1:
        assert "this process may use 1 CPUs of the host's" in stall["fix"] or "needs a CPU only" in stall["fix"]
    con = sqlite3.connect(out / "report.sqlite")
    name = "COALESCE(e.text, (SELECT value FROM StringIds WHERE id = e.textId))"
    rows = con.execute(f"""
        SELECT CAST(substr(c.name, 16) AS INTEGER) * 1000, w.e - w.s FROM
          (SELECT e.start s, e.end e, e.globalTid t FROM NVTX_EVENTS e WHERE {name} LIKE 'dataloader.next %') w
          JOIN (SELECT e.start s, e.globalTid t, {name} name FROM NVTX_EVENTS e
                WHERE {name} LIKE 'dataloader.cpu %') c ON c.t = w.t AND c.s >= w.s AND c.s <= w.e""").fetchall()
    share = float(np.median([min(1.0, cpu / wall) for cpu, wall in rows if wall > 0]))  # the typical load's
    assert d["dataloader"]["loaders"][0]["fetch_cpu_share"] == pytest.approx(share, abs=1e-4)
    assert share < 0.5  # the samples sleep: a worker needs far less than a core


@pytest.mark.torch
def test_a_main_process_fetch_counts_the_cpu_torch_s_own_threads_spend_on_it():
    """num_workers=0: torch's intra-op threads share a fetch's tensor work, which one worker would do alone (held
    out on an H200, 8 CPUs allowed: a timm ConvNeXt's fetch measured by the main thread alone sized 1 worker, and
    the step got slower, 73.4 -> 76.6 ms). The fetch's CPU counts the other threads' time too."""
    import time

    import torch

    from nvtx_autotrace import dataloader

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: torch has no second thread to share the work")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1200, 1200)
        own, others = time.thread_time_ns(), dataloader._other_threads_ns()
        for _ in range(15):
            x @ x
        own, others = time.thread_time_ns() - own, dataloader._other_threads_ns() - others
    finally:
        torch.set_num_threads(threads)
    assert others > 0.3 * own  # the second thread did a real share, which the main thread's clock misses
