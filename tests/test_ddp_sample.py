"""The two-rank DistributedDataParallel sample (2 H200s, nvtx-trace run -- torchrun): per-GPU
figures, per-rank steps and loader advice, checked against NVIDIA's gpu-starv rule and plain SQL."""

from __future__ import annotations

import pytest
from conftest import SAMPLES
from test_analyzer_gpu_reports import nsys_csv, sql, sql_union_busy

from nvtx_trace import names
from nvtx_trace.analyzer import analyze

PATH = SAMPLES / "resnet_ddp_flawed.sqlite"
RANGE_NAMES = """SELECT n.globalTid >> 24 & 0xFFFFFF AS pid, s.value AS name, n.start, n.end
                 FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60)"""


@pytest.fixture(scope="module")
def ddp():
    return analyze(PATH)


def test_each_gpu_is_measured_on_its_own(ddp):
    assert [d.device_id for d in ddp.idle.devices] == [0, 1]
    for dev in ddp.idle.devices:
        want = sql_union_busy(PATH, dev.device_id)
        assert (dev.busy_ns, dev.span_ns, dev.gap_count, dev.gap_idle_ns) == \
            (want["busy"], want["span"], want["gap_count"], want["gap_ns"])
        (pids,), = sql(PATH, "SELECT group_concat(DISTINCT globalPid >> 24 & 0xFFFFFF) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                             "WHERE deviceId = ?", dev.device_id)
        assert dev.pids == sorted(int(p) for p in pids.split(","))
    assert ddp.idle.devices[0].pids != ddp.idle.devices[1].pids  # one rank per GPU


def test_gaps_of_both_gpus_match_nsys_gpu_starvation_rule(ddp, nsys_path, tmp_path):
    starv = nsys_csv(nsys_path, tmp_path, PATH, "analyze", "-r", "gpu-starv:gap=1:rows=100000")
    theirs = set(zip(starv["Device ID"], starv["Start (ns)"], starv["Duration (ns)"]))
    g = ddp.idle.gaps
    ours = {(d, s, n) for d, s, n in zip(g["device_id"], g["start_ns"], g["duration_ns"]) if n > 1_000_000}
    assert ours == theirs
    assert {d for d, _, _ in theirs} == {0, 1}


def test_steps_belong_to_one_rank_and_stop_at_its_last_optimizer_step(ddp):
    rows = sql(PATH, RANGE_NAMES)
    pid = ddp.steps.pid
    step_ranges = [r for r in rows if r[0] == pid and names.STEP_RE.match(r[1])]
    optimizer = [r for r in rows if r[0] == pid and r[1].startswith(names.OPTIMIZER_STEP_PREFIX)]
    # autotrace opens one more step after the last optimizer step (teardown); the other rank's
    # optimizer steps, a few µs apart, must not keep it in.
    assert len(step_ranges) == len(optimizer) + 1 == 31
    assert len(ddp.steps.table) == len(optimizer) == 30
    assert ddp.steps.table["duration_ns"].iloc[-1] < 1e9  # the 2.5 s teardown step is gone


def test_two_ranks_with_one_worker_each_are_not_worker_restarts(ddp):
    rows = sql(PATH, RANGE_NAMES)
    worker_pids = {r[0] for r in rows if names.WORKER_FETCH_RE.match(r[1])}
    rank_pids = {r[0] for r in rows if names.LOADER_WAIT_RE.match(r[1])}
    assert len(worker_pids) == len(rank_pids) == 2
    assert ddp.loader.restarts == {}
    loader = ddp.loader.loaders.iloc[0]
    assert int(loader["waits"]) == sum(1 for r in rows if names.LOADER_WAIT_RE.match(r[1]))
    stall = next(f for f in ddp.findings if f.kind == "dataloader_stall")
    assert "persistent_workers" not in stall.fix and "num_workers=" in stall.fix


def test_idle_share_is_of_both_gpus_time(ddp):
    stall = next(f for f in ddp.findings if f.kind == "dataloader_stall")
    window_ns = ddp.window["end_ns"] - ddp.window["start_ns"]
    share = stall.impact_ns / (2 * window_ns)
    assert 0 < share <= 1
    assert f"({round(100 * share)} % of the window across 2 GPUs)" in stall.title


def test_the_step_chart_uses_the_gpu_of_the_rank_whose_steps_it_shows(ddp):
    from nvtx_trace.analyzer.questions import step_breakdown

    gaps = step_breakdown._gaps_of_step_device(ddp)
    (device,) = [d.device_id for d in ddp.idle.devices if ddp.steps.pid in d.pids]
    assert set(gaps["device_id"]) == {device}
    assert len(ddp.step_breakdown) == len(ddp.steps.table)


def _nccl_ns_in_window(device: int, window: dict) -> int:
    """Plain SQL: NCCL kernel time on one GPU, kernels starting in the window (one stream: they never overlap)."""
    (ns,) = sql(PATH, "SELECT sum(min(k.end, ?3) - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                      "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%' AND k.deviceId = ?1 "
                      "AND k.start >= ?2 AND k.start < ?3", device, window["start_ns"], window["end_ns"])[0]
    return int(ns)


def test_communication_is_split_from_compute_and_matches_sql(ddp):
    comm = {d.device_id: d for d in ddp.communication.devices}
    assert ddp.communication.matched  # both ranks issued the same collectives, paired one to one
    for dev, d in comm.items():
        assert d.communication_ns == pytest.approx(_nccl_ns_in_window(dev, ddp.window), rel=0.02)
        assert 0 <= d.wait_ns <= d.communication_ns and d.compute_ns > 0


def test_the_gpu_the_other_waits_for_is_the_straggler(ddp):
    """Impact = the waiting GPU's all-reduce time minus the slow GPU's, over the steady window (SQL)."""
    f = next(f for f in ddp.findings if f.kind == "straggler")
    slow = f.evidence["slow_device_id"]
    other = 1 - slow
    expected = _nccl_ns_in_window(other, ddp.window) - _nccl_ns_in_window(slow, ddp.window)
    assert f.impact_ns == pytest.approx(expected, rel=0.03)
    assert f.evidence["slow_rank"] in {d.pid for d in ddp.communication.devices if d.device_id == slow}
    assert set(f.evidence["wait_ns"]) == {"0", "1"} and "data loader" in f.title


def _spinning_by_step(device: int, steps) -> list[int]:
    """Plain SQL and Python: per step, the time the GPU spent inside NCCL kernels beyond the other GPU's
    time in the same (order-paired) collective, less any moment another kernel ran on that GPU."""
    kernels = sql(PATH, "SELECT k.deviceId, k.start, k.end, s.value LIKE 'nccl%' FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                        "JOIN StringIds s ON s.id = k.shortName ORDER BY k.start")
    nccl = {d: [(s, e) for dd, s, e, c in kernels if dd == d and c] for d in (0, 1)}
    n = min(len(v) for v in nccl.values())
    spans = []
    for mine, theirs in zip(nccl[device][:n], nccl[1 - device][:n]):
        wait = (mine[1] - mine[0]) - min(mine[1] - mine[0], theirs[1] - theirs[0])
        if wait > 0:
            spans.append((mine[0], mine[0] + wait))
    compute = [(s, e) for d, s, e, c in kernels if d == device and not c]
    events = sorted([(s, 0, 1) for s, _ in spans] + [(e, 0, -1) for _, e in spans]
                    + [(s, 1, 1) for s, _ in compute] + [(e, 1, -1) for _, e in compute])
    spin = []  # a sweep over the boundaries: inside a wait and outside every compute kernel
    active, last = [0, 0], None
    for t, which, delta in events:
        if last is not None and t > last and active[0] > 0 and active[1] == 0:
            spin.append((last, t))
        active[which] += delta
        last = t
    return [sum(max(0, min(e, b) - max(s, a)) for s, e in spin) for a, b in zip(steps["start_ns"], steps["end_ns"])]


def test_each_step_less_its_waiting_in_collectives_gives_compute_and_the_gpus_own_work(ddp):
    """Per step, not a mean subtracted from a median: the steps' GPU's spinning in collectives (no other
    kernel running), SQL-paired, leaves the step's compute and its GPU's own work (review of session 6)."""
    import numpy as np

    from nvtx_trace.analyzer import predict
    from nvtx_trace.units import ms

    steady = ddp.steps.steady
    device = next(d.device_id for d in ddp.communication.devices if d.pid == ddp.steps.pid)
    want = np.array(_spinning_by_step(device, steady), dtype=float)
    assert predict.collective_wait_by_step(ddp) == pytest.approx(want, abs=1.0)
    # the steps line shows it: of step time, the part the GPU spun (inside "GPU busy", yet waiting)
    summary = ddp.steps.summary()
    assert summary["collective_wait_fraction"] == pytest.approx(want.sum() / steady["duration_ns"].sum(), abs=1e-6)
    assert 0 < summary["collective_wait_fraction"] < summary["gpu_busy_fraction"]
    free = steady["duration_ns"].to_numpy() - steady["loader_wait_ns"].to_numpy() - want
    own = np.maximum(steady["gpu_busy_ns"].to_numpy() - want, 0)
    loader = next(f for f in ddp.findings if f.kind == "dataloader_stall")
    assert loader.evidence["compute_ns_per_step"] == pytest.approx(max(np.median(free), np.median(own)), abs=1)
    straggler = next(f for f in ddp.findings if f.kind == "straggler")
    assert f"the GPU's own work is {ms(np.median(own))} a step" in straggler.fix


def test_a_process_driving_two_gpus_spins_only_while_neither_computes():
    """Edge case (hand-built rows; no real capture of one process on two GPUs with a peer is at hand): GPU 0's
    collective waits 0-100 while the same process computes on GPU 1 during 0-60; only 60-100 is spinning."""
    import pandas as pd

    from nvtx_trace.analyzer.measures.collectives import analyze_collectives
    from nvtx_trace.analyzer.trace import intervals as iv

    rows = [  # (device, pid, name_id, start, end): GPU 2 is the peer process, its collective is the transfer
        (0, 10, 1, 0, 110), (1, 10, 2, 0, 60), (2, 20, 1, 90, 110),
    ]
    ops = pd.DataFrame(rows, columns=["device_id", "pid", "name_id", "start_ns", "end_ns"]).assign(kind=0)
    comm = analyze_collectives(ops, {1: "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2: "volta_sgemm"}, (0, 200))
    waits = {d.device_id: d.wait_ns for d in comm.devices}
    assert waits == {0: 90, 2: 0}
    assert iv.Coverage(comm.wait_sets[10]).measure(0, 200) == 30  # 0-90 waiting, less 0-60 computing on GPU 1


def _periodic(first: int, last: int, device: int, pid: int, dur_ns: int, shift_ns: int = 0) -> list[tuple]:
    """All-reduces k = first..last-1, each ending at k ms (+ shift) on this GPU, lasting ``dur_ns``."""
    return [(device, pid, 1, k * 1_000_000 + shift_ns - dur_ns, k * 1_000_000 + shift_ns) for k in range(first, last)]


@pytest.mark.parametrize("late_rank", [
    (100, 300),  # rank 1's capture began 99 collectives late: beyond any small shift of the order
    (10, 310),  # both captures hold 300, rank 1's 9 later at both ends: equal counts, shifted
])
def test_collectives_pair_on_their_ends_however_late_a_capture_began(late_rank):
    """Edge case (hand-built rows, review): rank 0 waits 0.2 ms in every all-reduce; pairs are found where the
    ends meet, so the waiting is 0.2 ms times the collectives both captured, and the rest have no partner."""
    import pandas as pd

    from nvtx_trace.analyzer.measures.collectives import analyze_collectives

    rows = _periodic(1, 301, 0, 10, 300_000) + _periodic(*late_rank, 1, 20, 100_000)
    ops = pd.DataFrame(rows, columns=["device_id", "pid", "name_id", "start_ns", "end_ns"]).assign(kind=0)
    comm = analyze_collectives(ops, {1: "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}, (0, 400_000_000))
    both = len(range(max(1, late_rank[0]), min(301, late_rank[1])))  # the collectives both captured
    assert [d.wait_ns for d in comm.devices] == [both * 200_000, 0]
    assert comm.unpaired == {0: 300 - both, 1: late_rank[1] - late_rank[0] - both}


def test_collectives_whose_ends_never_meet_do_not_pair_and_name_no_straggler():
    """Edge case (hand-built rows): rank 1's all-reduces end 0.5 ms off any of rank 0's (two unrelated jobs,
    or clocks never aligned): any pairing would be wrong, so waiting is unknown, not a number."""
    import pandas as pd

    from nvtx_trace.analyzer.measures.collectives import analyze_collectives

    rows = _periodic(1, 101, 0, 10, 300_000) + _periodic(1, 101, 1, 20, 100_000, shift_ns=500_000)
    ops = pd.DataFrame(rows, columns=["device_id", "pid", "name_id", "start_ns", "end_ns"]).assign(kind=0)
    comm = analyze_collectives(ops, {1: "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}, (0, 200_000_000))
    assert comm.matched is False and [d.wait_ns for d in comm.devices] == [None, None]
    assert comm.unpaired == {0: 100, 1: 100} and "GPU 0: 100 of its 100" in comm.pairing_warning()
    assert comm.wait_sets == {}
