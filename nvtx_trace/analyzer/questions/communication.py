"""Per GPU: how much of its busy time is compute, communication, and spinning in collectives for a peer?"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.findings import ms
from nvtx_trace.analyzer.measures.collectives import alone_warning, analyze_collectives
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv


def _run(ctx: Context) -> None:
    a = ctx.result
    if not ctx.trace.has_gpu_activity or not a.window:
        return
    ids = [int(i) for i in pd.unique(ctx.trace.gpu_ops["name_id"]) if i >= 0]
    window = (a.window["start_ns"], a.window["end_ns"])
    a.communication = analyze_collectives(ctx.trace.gpu_ops, ctx.reader.strings(ids), window)
    reports = len(getattr(ctx.trace, "ranks", None) or [None])
    kernels = ctx.trace.gpu_ops[ctx.trace.gpu_ops["kind"] == 0]
    others = a.communication is not None and bool((kernels["device_id"] != a.communication.devices[0].device_id).any())
    warning = alone_warning(a.communication, window, reports=reports, other_kernels=others)
    spinning = a.communication.wait_sets.get(a.steps.pid) if a.communication and a.steps else None
    every_step = False
    if spinning is not None:  # each step's GPU spinning in collectives for a peer: busy, but not work
        t = a.steps.table
        bounds = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
        lone = a.communication.unpaired_sets.get(a.steps.pid, iv.empty())
        unknown = iv.Coverage(lone).measure(*bounds) > 0  # a collective without a partner: its wait unknown
        t["collective_wait_ns"] = np.where(unknown, np.nan, iv.Coverage(spinning).measure(*bounds))
        a.steps.measured += ("collective_wait",)
        every_step = bool(len(a.steps.steady)) and a.steps.steady["collective_wait_ns"].isna().all()
    unpaired = a.communication.pairing_warning(every_step) if a.communication is not None else None
    ctx.trace.warnings.extend(w for w in (warning, unpaired) if w)


def _json(a) -> dict:
    c = a.communication
    if c is None:
        return {"communication": None}
    return {"communication": {"matched": c.matched, "devices": c.table()}}


def _text(a, view) -> None:
    if a.communication is None:
        return
    rows = []
    for d in a.communication.devices:
        wait = (ms(d.wait_ns) if d.wait_ns is not None else "unknown: no peer's report" if a.communication.alone
                else "unknown: collectives did not pair")
        rows.append([str(d.device_id), ms(d.compute_ns), ms(d.communication_ns), wait, ms(d.overlap_ns)])
    cols = ("GPU", "compute", "communication", "of it waiting for a peer", "overlapped")
    view.table("Communication (steady window): busy time that is not work", [(c, "right") for c in cols], rows)


QUESTION = Question(
    name="communication", order=110, run=_run, needs=("window",),
    json_keys=("communication",), json_at=110, to_json=_json,
    tables=lambda a: {"communication": a.communication.table()} if a.communication else {},
    text=_text, text_at=40,
)
