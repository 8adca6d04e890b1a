"""One report per rank: how were the clocks joined, and how does each rank fare?"""

from __future__ import annotations

import pandas as pd

from nvtx_trace.analyzer.findings import ms, pct
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.ranks.checks import rank_rows


def _run(ctx: Context) -> None:
    """Per-rank rows, when the trace was merged from one report per rank (merge.MergedTrace)."""
    sources = getattr(ctx.trace, "ranks", None)
    if sources is None:
        return
    ctx.result.ranks = rank_rows(ctx.result, sources, ctx.step_range)
    ctx.result.clock = ctx.trace.clock.to_json()


def _json(a) -> dict:
    return {} if a.ranks is None else {"clock": a.clock, "ranks": a.ranks}


def _ms(ns: int | None) -> str:
    return "-" if ns is None else ms(ns)


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


def _text(a, view) -> None:
    """How the clocks were joined, then one row per rank (the slow one starred)."""
    if not a.ranks:
        return
    view.print(f"Clocks: {view.escape(a.clock['how'])}", highlight=False)
    cols = ("rank", "report", "GPU", "step median", "GPU busy", "waiting in collectives", "loader wait")
    rows = [[f"{r['rank']}{' *' if r['straggler'] else ''}", view.escape(r["report"].rsplit("/", 1)[-1]),
             ",".join(map(str, r["device_ids"])) or "-", _ms(r["step_ns_median"]),
             _pct(r["window_utilization"]), _ms(r["wait_ns"]), _ms(r["loader_wait_ns"])] for r in a.ranks]
    view.table("Ranks, one report each (* the rank the others wait for)",
               [(c, "left" if c in ("report", "GPU") else "right") for c in cols], rows)


def _html(a, d: dict, view) -> str:
    if not a.ranks:
        return ""
    return view.table(a.tables.get("ranks"), "Ranks, one report each",
                      {"rank": "rank", "report": "report", "device_ids": "GPU", "clock_offset_ns": "clock moved by",
                       "step_ns_median": "step median", "window_utilization": "GPU busy", "compute_ns": "compute",
                       "wait_ns": "waiting in collectives", "loader_wait_ns": "loader wait",
                       "straggler": "the others wait for it"}, a.clock["how"])


QUESTION = Question(
    name="ranks", order=150, run=_run, needs=("findings", "lanes"),
    results={"clock": None},  # how several reports were put on one clock (clocks.ClockPlan.to_json)
    json_keys=("clock", "ranks"), json_at=10, to_json=_json,
    tables=lambda a: {"ranks": pd.DataFrame(a.ranks)} if a.ranks else {},
    text=_text, text_at=20, html=_html, html_at=10,
)
