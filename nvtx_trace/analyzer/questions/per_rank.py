"""One report per rank: how were the clocks joined, and how does each rank fare?

A rank here is one input report (``nsys profile -o rank%q{RANK}`` writes one per process): its
processes, its GPUs, the offset that put it on the common clock, and its own figures in the
common steady window, so a slow rank shows in one row beside the others.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.measures.step_times import find_step_ranges, union_of_process
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms, pct


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


def rank_rows(analysis, sources, step_range: str | None) -> list[dict]:
    """Per input report, its figures in the common steady window (docs/json-schema.md, ``ranks[]``)."""
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    devices = {d.device_id: d for d in analysis.idle.devices} if analysis.idle else {}
    comm = {d.device_id: d for d in analysis.communication.devices} if analysis.communication else {}
    slow = next((f.evidence.get("slow_device_id") for f in analysis.findings if f.kind == "straggler"), None)
    ranges = analysis.nvtx_ranges
    rows = []
    for src in sources:
        mine = [devices[d] for d in src.devices if d in devices]
        busy = sum(int(iv.Coverage(d.busy).measure(w0, w1)) for d in mine)
        loader = None
        if analysis.loader is not None:
            loader = sum(int(iv.Coverage(union_of_process(analysis.loader.waits, p)).measure(w0, w1)) for p in src.pids)
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


def _run(ctx: Context) -> None:
    """Per-rank rows, when the trace was merged from one report per rank (merge.MergedTrace)."""
    sources = getattr(ctx.trace, "ranks", None)
    if sources is None:
        return
    ctx.result.ranks = rank_rows(ctx.result, sources, ctx.step_range)
    ctx.result.clock = ctx.trace.clock.to_json()


def _json(analysis) -> dict:
    return {} if analysis.ranks is None else {"clock": analysis.clock, "ranks": analysis.ranks}


def _duration(ns: int | None) -> str:
    return "-" if ns is None else ms(ns)


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


def _text(analysis, view) -> None:
    """How the clocks were joined, then one row per rank (the slow one starred)."""
    if not analysis.ranks:
        return
    view.print(f"Clocks: {view.escape(analysis.clock['how'])}", highlight=False)
    cols = ("rank", "report", "GPU", "step median", "GPU busy", "waiting in collectives", "loader wait")
    rows = [[f"{r['rank']}{' *' if r['straggler'] else ''}", view.escape(r["report"].rsplit("/", 1)[-1]),
             ",".join(map(str, r["device_ids"])) or "-", _duration(r["step_ns_median"]),
             _pct(r["window_utilization"]), _duration(r["wait_ns"]), _duration(r["loader_wait_ns"])] for r in analysis.ranks]
    view.table("Ranks, one report each (* the rank the others wait for)",
               [(c, "left" if c in ("report", "GPU") else "right") for c in cols], rows)


def _html(analysis, d: dict, view) -> str:
    if not analysis.ranks:
        return ""
    return view.table(analysis.tables.get("ranks"), "Ranks, one report each",
                      {"rank": "rank", "report": "report", "device_ids": "GPU", "clock_offset_ns": "clock moved by",
                       "step_ns_median": "step median", "window_utilization": "GPU busy", "compute_ns": "compute",
                       "wait_ns": "waiting in collectives", "loader_wait_ns": "loader wait",
                       "straggler": "the others wait for it"}, analysis.clock["how"])


QUESTION = Question(
    name="ranks", order=150, run=_run, needs=("findings", "lanes"),
    results={"clock": None},  # how several reports were put on one clock (clocks.ClockPlan.to_json)
    json_keys=("clock", "ranks"), json_at=10, to_json=_json,
    tables=lambda analysis: {"ranks": pd.DataFrame(analysis.ranks)} if analysis.ranks else {},
    text=_text, text_at=20, html=_html, html_at=10,
)
