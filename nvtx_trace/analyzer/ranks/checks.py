"""One report per rank: the checks before they are merged, and the per-rank rows after the analysis.

A rank here is one input report (``nsys profile -o rank%q{RANK}`` writes one per process): its
processes, its GPUs, the offset that put it on the common clock, and its own figures in the
common steady window, so a slow rank shows in one row beside the others.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from nvtx_trace.analyzer.measures.step_times import find_step_ranges, union_of_process
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.errors import BadReportError

if TYPE_CHECKING:  # only named in annotations: decoded reads reports, ranks compares them
    from nvtx_trace.analyzer.trace.decoded import DecodedReport

SAME_RUN_SLACK_NS = 60_000_000_000  # reports of one job start within a minute of each other's span


def check_reports(reports: list[DecodedReport]) -> None:
    """One clear line for inputs that cannot be ranks of one run: empty, the same twice, different runs."""
    for r in reports:
        if not len(r.gpu_ops) and not len(r.ranges):
            raise BadReportError(f"{r.path}: holds no GPU activity and no NVTX ranges, so it adds nothing to the "
                                 "analysis; capture every rank with: nsys profile -t cuda,nvtx")
    for i, a in enumerate(reports):
        for b in reports[i + 1:]:
            shared = a.active_pids() & b.active_pids()
            if a.signature == b.signature and shared:
                raise BadReportError(f"{a.path} and {b.path} hold the same process(es) of one capture (pid "
                                     f"{', '.join(map(str, sorted(shared)[:3]))}): the same report twice? pass each "
                                     "rank's report once")
            if not _overlap(a, b):
                raise BadReportError(f"{a.path} (captured {_when(a)}) and {b.path} (captured {_when(b)}) come from runs "
                                     "that did not overlap in time, so they are not ranks of one job; pass the "
                                     "reports of one run")


def _span(r: DecodedReport) -> tuple[int, int] | None:
    if r.utc_start_ns is None or r.session is None:
        return None
    return r.utc_start_ns, r.utc_start_ns + (r.session[1] - r.session[0])


def _overlap(a: DecodedReport, b: DecodedReport) -> bool:
    sa, sb = _span(a), _span(b)
    if sa is None or sb is None:
        return True  # cannot tell: trust the user
    return sa[0] - SAME_RUN_SLACK_NS <= sb[1] and sb[0] - SAME_RUN_SLACK_NS <= sa[1]


def _when(r: DecodedReport) -> str:
    return datetime.fromtimestamp(r.utc_start_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _steady_steps(ranges, pids: list[int], window: tuple[int, int], step_range: str | None) -> np.ndarray:
    """Durations of the rank's own step ranges that fall in the common steady window (by their middle: ranks
    start a step a few µs apart, so the window's edges, cut on one rank's steps, must not drop another's)."""
    if ranges is None or not len(ranges):
        return np.empty(0, np.int64)
    steps, _ = find_step_ranges(ranges[ranges["pid"].isin(pids).to_numpy()], step_range)
    if not len(steps):
        return np.empty(0, np.int64)
    start, end = steps["start_ns"].to_numpy(), steps["end_ns"].to_numpy()
    middle = (start + end) // 2
    inside = (middle >= window[0]) & (middle < window[1])
    return (end - start)[inside]


def rank_rows(a, sources, step_range: str | None) -> list[dict]:
    """Per input report, its figures in the common steady window (docs/json-schema.md, ``ranks[]``)."""
    w0, w1 = a.window["start_ns"], a.window["end_ns"]
    devices = {d.device_id: d for d in a.idle.devices} if a.idle else {}
    comm = {d.device_id: d for d in a.communication.devices} if a.communication else {}
    slow = next((f.evidence.get("slow_device_id") for f in a.findings if f.kind == "straggler"), None)
    ranges = a.nvtx_ranges
    rows = []
    for src in sources:
        mine = [devices[d] for d in src.devices if d in devices]
        busy = sum(int(iv.Coverage(d.busy).measure(w0, w1)) for d in mine)
        loader = None
        if a.loader is not None:
            loader = sum(int(iv.Coverage(union_of_process(a.loader.waits, p)).measure(w0, w1)) for p in src.pids)
        steady = _steady_steps(ranges, src.pids, (w0, w1), step_range)
        in_comm = [comm[d] for d in src.devices if d in comm]
        rows.append({
            "rank": src.index, "report": str(src.path), "session": src.session, "clock_offset_ns": src.offset_ns,
            "pids": src.pids, "device_ids": src.devices,
            "steps": int(len(steady)), "step_ns_median": int(np.median(steady)) if len(steady) else None,
            "busy_ns": busy if mine else None,
            "window_utilization": busy / (len(mine) * (w1 - w0)) if mine and w1 > w0 else None,
            "compute_ns": sum(d.compute_ns for d in in_comm) if in_comm else None,
            "communication_ns": sum(d.communication_ns for d in in_comm) if in_comm else None,
            "wait_ns": sum(d.wait_ns for d in in_comm) if in_comm and None not in [d.wait_ns for d in in_comm] else None,
            "loader_wait_ns": loader,
            "straggler": slow is not None and slow in src.devices,
        })
    return rows
