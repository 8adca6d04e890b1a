"""When is each GPU idle, and what was the CPU doing in each gap?"""

from __future__ import annotations

import pandas as pd

from nvtx_trace.analyzer.measures.gpu_idle import analyze_idle
from nvtx_trace.analyzer.measures.kernel_kinds import gpu_missing
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.units import ms, pct


def _run(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        ctx.result.idle = analyze_idle(ctx.trace, ctx.min_gap_ns, ctx.loader_pattern)
    else:
        ctx.result.skipped["gpu_idle"] = gpu_missing(ctx.trace)


def _json(analysis) -> dict:
    if not analysis.idle:
        return {"devices": [], "idle_causes": None}
    return {"devices": [{
        "device_id": d.device_id, "name": d.name, "pids": d.pids, "span_start_ns": d.span_start_ns,
        "span_end_ns": d.span_end_ns, "span_ns": d.span_ns, "busy_ns": d.busy_ns, "utilization": d.utilization,
        "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
        "window_utilization": analysis.window_utilization.get(d.device_id),
    } for d in analysis.idle.devices], "idle_causes": {"window": analysis.window_causes, "whole_trace": analysis.idle.causes}}


def _tables(analysis) -> dict:
    if not analysis.idle:
        return {}
    return {"devices": pd.DataFrame([{
        "device_id": d.device_id, "name": d.name, "span_ns": d.span_ns, "busy_ns": d.busy_ns,
        "utilization": d.utilization, "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
    } for d in analysis.idle.devices]), "gaps": analysis.idle.gaps, "causes": analysis.idle.causes}


def _text(analysis, view) -> None:
    if not (analysis.idle and analysis.idle.devices):
        return
    cols = ("GPU", "util.", "util. (trace)", "busy (trace)", f"gaps>={ms(analysis.min_gap_ns)} (trace)", "idle in them")
    rows = []
    for d in analysis.idle.devices:
        steady = analysis.window_utilization.get(d.device_id)
        rows.append([f"{d.device_id} {d.name}", pct(steady) if steady is not None else "-", pct(d.utilization),
                     ms(d.busy_ns), str(d.gap_count), ms(d.gap_idle_ns)])
    view.table("GPU activity", [(c, "left" if c == "GPU" else "right") for c in cols], rows)


QUESTION = Question(
    name="idle", order=20, run=_run,
    json_keys=("devices", "idle_causes"), json_at=50, to_json=_json, tables=_tables,
    text=_text, text_at=30,
)
