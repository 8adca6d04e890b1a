"""What happens once before the first step (module loading, cuDNN autotuning, first CUDA calls)?"""

from __future__ import annotations

import functools

import numpy as np

from nvtx_trace.analyzer.measures.startup_time import analyze_startup
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms


def _run(ctx: Context) -> None:
    analysis = ctx.result
    if not analysis.steps or not len(analysis.steps.table):
        return
    busy = None
    if analysis.idle:
        devices = analysis.idle.devices
        sets = [d.busy for d in devices if analysis.steps.pid in d.pids] or [d.busy for d in devices]
        busy = functools.reduce(iv.merge, sets)
    analysis.startup = analyze_startup(ctx.trace, int(analysis.steps.table["start_ns"].min()), busy,
                                       float(np.median(analysis.steps.table["duration_ns"])))


def _text(analysis, view) -> None:
    st = analysis.startup
    if st is None or st.duration_ns <= 0:
        return
    parts = ", ".join(f"{k} {ms(v)}" for k, v in list(st.parts.items())[:3])
    view.print(f"Start-up: {ms(st.duration_ns)} before the first step" + (f" (slow CUDA calls: {parts})"
               if parts else "") + "; it happens once and is left out of every per-step figure", highlight=False)


QUESTION = Question(
    name="startup", order=120, run=_run, needs=("steps", "idle"),
    json_keys=("startup",), json_at=40,
    to_json=lambda analysis: {"startup": analysis.startup.to_dict() if analysis.startup else None},
    text=_text, text_at=60,
)
