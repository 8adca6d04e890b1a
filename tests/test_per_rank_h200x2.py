"""What ``nvtx-trace run --per-rank -- torchrun --nproc_per_node=2 programs/ddp_train.py --slow-rank 1``
wrote on two H200s of one host (default window: every rank profiled steps 10-29 under its own nsys;
sample_reports/README.md). Checked independently: the straggler against plain SQL over each rank's NCCL
kernels, the ranks' steps against SQL on each file, and the two clocks against each other: on one host
the sessions' own start times and the collective ends must give the same offset.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from conftest import SAMPLES
from test_ddp_h200x2 import nccl_ns, straggler

from nvtx_trace.analyzer import analyze

RANKS = [SAMPLES / f"ddp_per_rank_window_rank{r}_h200x2.sqlite" for r in (0, 1)]


@pytest.fixture(scope="module")
def merged():
    return analyze([str(p) for p in RANKS])


def one(path, query):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(query).fetchall()


def test_the_straggler_is_rank_1_and_its_impact_is_the_nccl_time_difference(merged):
    f = straggler(merged)
    assert f.evidence["slow_device_id"] == 1 and [r["straggler"] for r in merged.ranks] == [False, True]
    offset = merged.ranks[1]["clock_offset_ns"]
    sql = nccl_ns(RANKS[0], 0, merged.window) - nccl_ns(RANKS[1], 1, merged.window, offset)
    assert f.impact_ns == pytest.approx(sql, rel=0.03)  # the waiting GPU's all-reduce time minus the slow one's
    assert merged.ranks[0]["wait_ns"] == pytest.approx(f.impact_ns, rel=0.03)


def test_one_hosts_two_sessions_give_the_same_offset_by_start_times_and_by_collective_ends(merged):
    moved = merged.clock["sessions"][1]
    assert moved["method"] == "collective-ends" and moved["paired_collectives"] >= 20
    (start0,), (start1,) = (one(p, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0] for p in RANKS)
    assert abs((start1 - start0) - moved["offset_ns"]) < 5_000  # 5 µs; seen: 1.6 µs here, 0.2 µs on another pair
    assert moved["residual_ns"] < 5_000


def test_each_ranks_steps_are_the_window_the_run_chose(merged):
    for row, path in zip(merged.ranks, RANKS):
        names = [n for (n,) in one(path, "SELECT COALESCE(s.value, e.text) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                                          "ON s.id = e.textId WHERE COALESCE(s.value, e.text) GLOB 'step [0-9]*' "
                                          "ORDER BY e.start")]
        assert names == [f"step {i}" for i in range(10, 30)]  # the default window, the same on both ranks
        spans = np.array(one(path, "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = "
                                   "e.textId WHERE COALESCE(s.value, e.text) GLOB 'step [0-9]*'")) + row["clock_offset_ns"]
        middle = spans.sum(axis=1) // 2
        inside = spans[(middle >= merged.window["start_ns"]) & (middle < merged.window["end_ns"])]
        assert row["steps"] == len(inside) and row["step_ns_median"] == int(np.median(inside[:, 1] - inside[:, 0]))


def test_the_waiting_ranks_report_alone_says_its_busy_time_may_be_waiting():
    """Rank 0's report by itself: 84 % of its window is NCCL time spent mostly waiting for rank 1; alone it
    cannot be split, so it must not read as 'nothing to fix'."""
    a = analyze(RANKS[0])
    (d,) = a.communication.devices
    assert d.wait_ns is None and d.last_arrivals is None and a.communication.matched is None
    assert d.communication_ns == nccl_ns(RANKS[0], 0, a.window)  # SQL: NCCL kernel time in the window
    (warning,) = [w for w in a.warnings if w.startswith("one rank's collectives:")]
    assert "GPU 0 spends 84 % of the window" in warning and "nvtx-trace analyze rank0.sqlite rank1.sqlite" in warning
    assert not any(f.kind == "straggler" for f in a.findings)
    slow = analyze(RANKS[1])  # the straggler's own report: 2 ms of collectives, nothing to warn about
    assert slow.communication.devices[0].communication_ns < 0.01 * (slow.window["end_ns"] - slow.window["start_ns"])
    assert not any(w.startswith("one rank's collectives:") for w in slow.warnings)


def test_merged_with_a_rank_captured_without_cuda_the_warning_says_so(tmp_path):
    """Edge case (a copy of rank 1's real export with its CUDA rows deleted, as a capture without -t cuda
    would leave it): the merge holds one GPU, so the warning must not ask for the reports just given."""
    import shutil

    bare = tmp_path / "rank1.sqlite"
    shutil.copy(RANKS[1], bare)
    with sqlite3.connect(bare) as db:
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table in tables & {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                               "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME"}:
            db.execute(f"DELETE FROM {table}")
    a = analyze([str(RANKS[0]), str(bare)])
    (warning,) = [w for w in a.warnings if w.startswith("one rank's collectives:")]
    assert "the other report holds no GPU kernels (captured without CUDA tracing?" in warning
    assert "rank0.sqlite rank1" not in warning


def test_merged_with_a_rank_whose_gpu_ran_no_collectives_the_warning_says_so(tmp_path):
    """Edge case (a copy of rank 1's real export with its NCCL kernel rows deleted): the other GPU computes but
    never communicates, so the warning names that rather than a capture without CUDA tracing."""
    import shutil

    quiet = tmp_path / "rank1.sqlite"
    shutil.copy(RANKS[1], quiet)
    with sqlite3.connect(quiet) as db:
        nccl = "SELECT id FROM StringIds WHERE value LIKE 'nccl%'"
        db.execute(f"DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE shortName IN ({nccl}) OR demangledName IN ({nccl})")
        assert db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] > 0
    a = analyze([str(RANKS[0]), str(quiet)])
    (warning,) = [w for w in a.warnings if w.startswith("one rank's collectives:")]
    assert "the other GPUs here ran no communication kernels" in warning and "CUDA tracing" not in warning


def test_ranks_on_different_hosts_each_get_their_hosts_cores_for_workers(tmp_path):
    """Edge case (the two real rank exports, their redacted host names set to two hosts, as two nodes of
    32 cores would write them): each rank has a host to itself, so the loader advice may use 31 workers (32
    cores less the training loop), not 15 as for two ranks sharing one host (review)."""
    import shutil

    from nvtx_trace.analyzer.measures.loader_waits import workers_needed

    def named(src, host):
        copy = shutil.copyfile(src, tmp_path / f"{host}_{src.name}")
        with sqlite3.connect(copy) as db:
            db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (host,))
        return copy

    one_host = analyze([named(p, "node1") for p in RANKS], workers=1)
    two_hosts = analyze([named(RANKS[0], "node1"), named(RANKS[1], "node2")], workers=1)
    shared, own = (next(f for f in a.findings if f.kind == "dataloader_stall") for a in (one_host, two_hosts))
    have = int(own.evidence["loaders"]["workers"].max())
    need = workers_needed(own.evidence["fetch_ns_per_batch"], own.evidence["compute_ns_per_step"], have, 32, 1)
    assert shared.recommend["num_workers"] == 32 // 2 - 1 == 15 and "32 CPU cores for 2 training" in shared.fix
    assert need > 15 and own.recommend["num_workers"] == min(need, 32 - 1)
    assert need <= 31 or f"{need} would keep up, but the smallest of the 2 hosts has 32 CPU cores" in own.fix
    assert len(set(two_hosts.pid_hosts.values())) == 2 and len(set(one_host.pid_hosts.values())) == 1
