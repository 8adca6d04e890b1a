"""What did the tool itself cost: nvtx_autotrace's ranges and, where measured, the profiler's tracing?"""

from __future__ import annotations

import numpy as np

from nvtx_trace.analyzer.measures.instrumentation_cost import MAX_TRACE_COST_NS, analyze_instrumentation
from nvtx_trace.analyzer.predict import collective_wait_by_step
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.labels import depth_text
from nvtx_trace.units import ms, pct


def _run(ctx: Context) -> None:
    analysis, ranges = ctx.result, ctx.trace.ranges
    if not len(ranges):
        return
    steady = len(analysis.steps.steady) if analysis.steps else 0
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    analysis.instrumentation = analyze_instrumentation(ranges, (w0, w1), analysis.steps.pid if analysis.steps else None, steady)
    if not analysis.instrumentation:
        return
    analysis.module_ranges_per_step = analysis.instrumentation.module_ranges_per_step
    if steady:
        ops = ctx.trace.gpu_ops if ctx.trace.has_gpu_activity else None
        n_ops = int(((ops["start_ns"] >= w0) & (ops["start_ns"] < w1)).sum()) if ops is not None else 0
        table = analysis.steps.steady
        idle = None
        if "gpu_busy" in analysis.steps.measured and ops is not None:  # a GPU spinning in a collective waits for a
            # peer's host, which tracing slows too (communication runs first and measured it)
            waiting = np.nan_to_num(collective_wait_by_step(analysis))
            idle = float(np.mean(table["duration_ns"].to_numpy() - table["gpu_busy_ns"].to_numpy() + waiting))
        steps = table["duration_ns"].to_numpy(dtype=float)
        if "loader_wait" in analysis.steps.measured:  # the loader's waits are no tracing's (compare_with_capture)
            steps = steps - table["loader_wait_ns"].to_numpy(dtype=float)
        analysis.instrumentation.compare_with_capture(float(np.median(steps)),
                                                      n_ops / steady + analysis.instrumentation.ranges_per_step, idle)


def _json(analysis) -> dict:
    inst = analysis.instrumentation
    return {"instrumentation": inst.to_dict() if inst else None, "profiler": inst.profiler_dict() if inst else None}


def _text(analysis, view) -> None:
    inst = analysis.instrumentation
    if not inst:
        return
    cost = "not measured" if inst.cost_ns_per_step is None else f"{ms(inst.cost_ns_per_step)} of CPU time per step"
    median = (analysis.steps.summary() or {}).get("step_ns_median") if analysis.steps else None
    share = f" ({pct(inst.cost_ns_per_step / median)} of the median step)" \
        if inst.cost_ns_per_step is not None and median else ""
    depth = depth_text(inst.settings)
    view.print(f"Instrumentation: {inst.ranges_per_step:.0f} nvtx_autotrace ranges per step, {cost}{share}"
               + (f"; {depth}" if depth else ""), highlight=False)
    if not (inst.outside_capture_step_ns and median):
        return
    took = f"Profiler: steps took {ms(inst.outside_capture_step_ns)} just before the capture and {ms(median)} inside it"
    if inst.profiler_cost_ns_per_step is not None:
        view.print(f"{took}; {ms(inst.profiler_cost_ns_per_step)} a step "
                   f"({pct(inst.profiler_cost_ns_per_step / median)}) is nsys's own tracing, left out of "
                   "CPU-bound findings", highlight=False)
    elif inst.profiler_gpu_idle_ns_per_step is not None:
        view.print(f"{took}, but the GPU waited for the host only {ms(inst.profiler_gpu_idle_ns_per_step)} a step "
                   "in it: nsys's tracing slows the host, so the difference is not its cost (the program's own "
                   "drift, GPU clocks); nothing is left out for it", highlight=False)
    elif inst.profiler_traced_per_step is not None:
        view.print(f"{took}, more than nsys's tracing can add (at most {ms(MAX_TRACE_COST_NS)} for each of the "
                   f"{inst.profiler_traced_per_step:,.0f} GPU operations and ranges it traced a step): the "
                   "difference is the program's own, and nothing is left out for it", highlight=False)
    elif median < inst.outside_capture_step_ns:
        view.print(f"{took}, faster under the profiler: its own cost could not be measured", highlight=False)


QUESTION = Question(
    name="instrumentation", order=111, run=_run, needs=("window", "steps", "communication"),
    results={"module_ranges_per_step": 0.0},  # nvtx_autotrace module ranges per steady step (their CPU cost shows)
    json_keys=("instrumentation", "profiler"), json_at=120, to_json=_json,
    text=_text, text_at=70,
)
