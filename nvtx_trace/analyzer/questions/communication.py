"""Per GPU: how much of its busy time is compute, communication, and spinning in collectives for a peer?"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.measures.collectives import alone_warning, analyze_collectives
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms


def _run(ctx: Context) -> None:
    analysis = ctx.result
    if not ctx.trace.has_gpu_activity or not analysis.window:
        return
    ids = [int(i) for i in pd.unique(ctx.trace.gpu_ops["name_id"]) if i >= 0]
    window = (analysis.window["start_ns"], analysis.window["end_ns"])
    analysis.communication = analyze_collectives(ctx.trace.gpu_ops, ctx.reader.strings(ids), window)
    reports = len(getattr(ctx.trace, "ranks", None) or [None])
    kernels = ctx.trace.gpu_ops[ctx.trace.gpu_ops["kind"] == 0]
    others = (analysis.communication is not None
              and bool((kernels["device_id"] != analysis.communication.devices[0].device_id).any()))
    warning = alone_warning(analysis.communication, window, reports=reports, other_kernels=others)
    spinning = analysis.communication.wait_sets.get(analysis.steps.pid) if analysis.communication and analysis.steps else None
    every_step = False
    if spinning is not None:  # each step's GPU spinning in collectives for a peer: busy, but not work
        t = analysis.steps.table
        bounds = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
        lone = analysis.communication.unpaired_sets.get(analysis.steps.pid, iv.empty())
        unknown = iv.Coverage(lone).measure(*bounds) > 0  # a collective without a partner: its wait unknown
        t["collective_wait_ns"] = np.where(unknown, np.nan, iv.Coverage(spinning).measure(*bounds))
        analysis.steps.measured += ("collective_wait",)
        every_step = bool(len(analysis.steps.steady)) and analysis.steps.steady["collective_wait_ns"].isna().all()
    unpaired = analysis.communication.pairing_warning(every_step) if analysis.communication is not None else None
    ctx.trace.warnings.extend(w for w in (warning, unpaired) if w)


def _json(analysis) -> dict:
    c = analysis.communication
    if c is None:
        return {"communication": None}
    return {"communication": {"matched": c.matched, "devices": c.table()}}


def _text(analysis, view) -> None:
    if analysis.communication is None:
        return
    rows = []
    for d in analysis.communication.devices:
        wait = (ms(d.wait_ns) if d.wait_ns is not None else "unknown: no peer's report" if analysis.communication.alone
                else "unknown: collectives did not pair")
        rows.append([str(d.device_id), ms(d.compute_ns), ms(d.communication_ns), wait, ms(d.overlap_ns)])
    cols = ("GPU", "compute", "communication", "of it waiting for a peer", "overlapped")
    view.table("Communication (steady window): busy time that is not work", [(c, "right") for c in cols], rows)


QUESTION = Question(
    name="communication", order=110, run=_run, needs=("window",),
    json_keys=("communication",), json_at=110, to_json=_json,
    tables=lambda analysis: {"communication": analysis.communication.table()} if analysis.communication else {},
    text=_text, text_at=40,
)
