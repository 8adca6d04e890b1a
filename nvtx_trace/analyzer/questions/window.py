"""Which stretch of the trace is the steady state every later figure is measured in?"""

from __future__ import annotations

from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.units import ms


def _run(ctx: Context) -> None:
    analysis = ctx.result
    lo, hi = analysis.trace_start_ns, analysis.trace_end_ns
    window = analysis.steps.steady_window() if analysis.steps else None
    if analysis.steps and not window:
        analysis.window = {"start_ns": lo, "end_ns": hi,
                           "source": f"whole trace (all {len(analysis.steps.table)} steps counted as warm-up)"}
    elif window:
        first, last = int(analysis.steps.steady["step"].iloc[0]), int(analysis.steps.steady["step"].iloc[-1])
        inferred = {"inferred:kernel-period": ", inferred from the kernel sequence",
                    "inferred:nvtx-period": ", inferred from a recurring range"}.get(analysis.steps.source, "")
        n = analysis.steps.warmup_steps
        after = {0: "no warm-up step left out", 1: "after 1 warm-up step"}.get(n, f"after {n} warm-up steps")
        if analysis.steps.capture_first_step is not None:
            after = f"the capture opened at step {analysis.steps.capture_first_step}, after warm-up" + \
                (f", and {n} more warm-up step{'s' if n > 1 else ''} left out" if n else "")
        analysis.window = {"start_ns": window[0], "end_ns": window[1],
                           "source": f"steady-state steps {first}-{last}, {after}{inferred}",
                           "program": analysis.steps.program}
    else:
        analysis.window = {"start_ns": lo, "end_ns": hi, "source": "whole trace (no step ranges)"}


def _text(analysis, view) -> None:
    if analysis.window:
        span = analysis.window["end_ns"] - analysis.window["start_ns"]
        view.print(f"Window: {analysis.window['source']}, {ms(span)} long; every figure below is measured in it unless "
                   "marked (trace): the whole trace", highlight=False)


QUESTION = Question(
    name="window", order=80, run=_run, needs=("steps",), results={"window": {}},
    json_keys=("window",), json_at=30, to_json=lambda analysis: {"window": analysis.window or None},
    text=_text, text_at=10,
)
