"""How much GPU idle is left that no other finding counts, and what caused most of it?"""

from __future__ import annotations

from nvtx_trace.analyzer.basis import CPU_CAUSES
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.gpu_idle import CAUSE_FIXES, gaps_in
from nvtx_trace.analyzer.measures.pageable_copies import per_step as per_step_pageable
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct

COUNTED_BY = {"dataloader_stall": ("dataloader",), "sync": ("sync",), "pageable_h2d": ("copy",),  # finding -> causes
              "allocator": ("sync", "cuda_api"), "optimizer": ("optimizer",)}


def _findings(analysis, basis) -> list[Finding]:
    """Impacts add up: idle time a cause finding already counts is not counted again (nor the tool's own share
    of CPU-bound idle). What is left, idle in gaps whose cause has no finding of its own, is one finding."""
    if not analysis.idle:
        return []
    covered = {f.evidence.get("cause") for f in basis.found if isinstance(f.evidence, dict)}
    covered |= {c for f in basis.found for c in COUNTED_BY.get(f.kind, ())}
    cause_ns = {c: int(ns * basis.keep) if c in CPU_CAUSES else ns for c, ns in basis.cause_ns.items()
                if c not in covered}
    window_ns = basis.gpu_ns
    in_window = gaps_in(analysis.idle.gaps, (analysis.window["start_ns"], analysis.window["end_ns"]))
    in_window = in_window[in_window["cause"].isin(list(cause_ns))] if "cause" in in_window else in_window
    idle = int(sum(cause_ns.values()))
    if idle < THRESHOLDS["min_impact_ns"] or idle < THRESHOLDS["gpu_idle_fraction"] * window_ns:
        return []
    ranked = sorted(cause_ns.items(), key=lambda kv: kv[1], reverse=True)
    labels = dict(zip(analysis.window_causes["cause"], analysis.window_causes["label"]))
    top, top_ns = ranked[0]
    parts = ", ".join(f"{labels[c]}: {pct(ns / idle)}" for c, ns in ranked[:3] if ns)
    devs = ", ".join(f"GPU {d} {pct(u)} busy" for d, u in analysis.window_utilization.items())
    fix = CAUSE_FIXES.get(top, "")
    per_step = per_step_pageable(analysis)[0]
    if top == "copy" and per_step is not None and not per_step.count:
        # the label came from the copy range the thread was in; its copies are pinned already
        fix = ("The copies inside the steps already come from pinned memory: overlap them with compute "
               "(copy the next batch on a side stream, non_blocking=True) or copy fewer bytes (uint8 inputs, "
               "normalize on the GPU).")
    return [Finding(
        kind="gpu_idle",
        title=f"GPU idle {ms(idle)} ({pct(idle / window_ns)} of the window"
              + (f", summed over {len(analysis.idle.devices)} GPUs" if len(analysis.idle.devices) > 1 else "")
              + f") in gaps >= {ms(analysis.min_gap_ns)} that no other finding counts; {parts}",
        impact_ns=idle,
        fix=fix,
        threshold=f"gaps >= {ms(analysis.min_gap_ns)} covering >= {pct(THRESHOLDS['gpu_idle_fraction'])} of the window",
        evidence={"window": analysis.window, "devices": devs,
                  "causes": analysis.window_causes[["device_id", "cause", "label", "idle_ns", "share", "gaps"]],
                  "largest_gaps": in_window.nlargest(5, "duration_ns")[["device_id", "start_ns", "duration_ns", "cause"]],
                  "cpu_during_largest_gaps": analysis.gap_activity.head(20) if analysis.gap_activity is not None else []},
    )]


QUESTION = Question(
    name="unexplained_idle", order=900, needs=("window_figures", "instrumentation"),  # last: it reads all others
    thresholds={"gpu_idle_fraction": 0.10},  # report idle when gaps >= min_gap cover 10 % of the window
    findings=_findings, idle_kinds=("gpu_idle",),
)
