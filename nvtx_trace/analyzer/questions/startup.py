"""What happens once before the first step (module loading, cuDNN autotuning, first CUDA calls)?"""

from __future__ import annotations

import functools

import numpy as np

from nvtx_trace.analyzer.findings import ms
from nvtx_trace.analyzer.measures.startup_time import analyze_startup
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv


def _run(ctx: Context) -> None:
    a = ctx.result
    if not a.steps or not len(a.steps.table):
        return
    busy = None
    if a.idle:
        sets = [d.busy for d in a.idle.devices if a.steps.pid in d.pids] or [d.busy for d in a.idle.devices]
        busy = functools.reduce(iv.merge, sets)
    a.startup = analyze_startup(ctx.trace, int(a.steps.table["start_ns"].min()), busy,
                                float(np.median(a.steps.table["duration_ns"])))


def _text(a, view) -> None:
    st = a.startup
    if st is None or st.duration_ns <= 0:
        return
    parts = ", ".join(f"{k} {ms(v)}" for k, v in list(st.parts.items())[:3])
    view.print(f"Start-up: {ms(st.duration_ns)} before the first step" + (f" (slow CUDA calls: {parts})"
               if parts else "") + "; it happens once and is left out of every per-step figure", highlight=False)


QUESTION = Question(
    name="startup", order=120, run=_run, needs=("steps", "idle"),
    json_keys=("startup",), json_at=40, to_json=lambda a: {"startup": a.startup.to_dict() if a.startup else None},
    text=_text, text_at=60,
)
