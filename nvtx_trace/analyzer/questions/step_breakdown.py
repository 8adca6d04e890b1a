"""Where did each step's wall time go?

With GPU activity, from the GPU's view: each step's duration is split into GPU compute (busy) and GPU
idle, and the idle part into the causes the gap analysis found (waiting for data, host-side copies, host
syncs) plus "other idle" (other causes and gaps shorter than ``--min-gap-ms``). A gap that straddles two
steps is shared between them in proportion to its overlap with each, so every row adds up to the step time.

Without GPU activity (a CPU run), from the training thread's view, with what was measured: its waits for
the next batch and its host syncs inside the step (each where captured), and the rest, its own CPU work.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.question import Context, Question


def _run(ctx: Context) -> None:
    ctx.result.step_breakdown = breakdown(ctx.result)


GPU_PARTS = ("compute_ns", "loader_ns", "copy_ns", "sync_ns", "other_ns")
HOST_PARTS = ("loader_ns", "sync_ns", "cpu_ns")


def breakdown(analysis) -> pd.DataFrame | None:
    """step, warmup, duration_ns and its parts: GPU_PARTS with GPU activity, else HOST_PARTS (the others
    NaN: not measured); None without steps."""
    if analysis.steps is None or not len(analysis.steps.table):
        return None
    if "gpu_busy" not in analysis.steps.measured:
        return host_breakdown(analysis.steps)
    st = analysis.steps.table.sort_values("start_ns", ignore_index=True)
    s, e = st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64)
    out = pd.DataFrame({"step": st["step"].to_numpy(), "warmup": st["warmup"].to_numpy(),
                        "duration_ns": st["duration_ns"].to_numpy(np.int64),
                        "compute_ns": st["gpu_busy_ns"].to_numpy(np.int64)})
    shares = {"loader_ns": "dataloader_ns", "copy_ns": "copy_ns", "sync_ns": "sync_ns"}
    for col in shares:
        out[col] = 0.0
    gaps = _gaps_of_step_device(analysis)
    if gaps is not None and len(gaps):
        gs, ge = gaps["start_ns"].to_numpy(np.int64), gaps["end_ns"].to_numpy(np.int64)
        # Steps overlapping each gap: [first, last) by binary search (steps do not overlap).
        first = np.searchsorted(e, gs, side="right")
        last = np.searchsorted(s, ge, side="left")
        n = np.maximum(last - first, 0)
        gi = np.repeat(np.arange(gs.size), n)
        si = np.repeat(first, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        if gi.size:
            overlap = np.minimum(ge[gi], e[si]) - np.maximum(gs[gi], s[si])
            frac = np.clip(overlap, 0, None) / np.maximum(ge[gi] - gs[gi], 1)
            for col, src in shares.items():
                out[col] = np.bincount(si, weights=gaps[src].to_numpy(np.float64)[gi] * frac, minlength=len(out))
    idle = np.maximum(out["duration_ns"] - out["compute_ns"], 0)
    explained = out[list(shares)].sum(axis=1)
    scale = np.where(explained > idle, idle / np.maximum(explained, 1), 1.0)  # never more idle than there was
    for col in shares:
        out[col] = out[col] * scale
    out["other_ns"] = np.maximum(idle - out[list(shares)].sum(axis=1), 0)
    out["cpu_ns"] = np.nan
    return out


def host_breakdown(steps) -> pd.DataFrame:
    """A run without GPU activity: the steps table's own loader and sync waits (the training process's, already
    clipped to each step), NaN where not captured; ``cpu_ns`` is the rest of the step."""
    st = steps.table.sort_values("start_ns", ignore_index=True)
    out = pd.DataFrame({"step": st["step"].to_numpy(), "warmup": st["warmup"].to_numpy(),
                        "duration_ns": st["duration_ns"].to_numpy(np.int64)})
    for col in GPU_PARTS:
        out[col] = np.nan
    waited = np.zeros(len(st))
    for col, part in (("loader_ns", "loader_wait"), ("sync_ns", "sync_wait")):
        if part in steps.measured:
            out[col] = st[f"{part}_ns"].to_numpy(np.float64)
            waited += np.nan_to_num(out[col].to_numpy())
    # A sync inside a loader wait (pin-memory thread) would count twice: never more waiting than the step.
    out["cpu_ns"] = np.maximum(out["duration_ns"] - waited, 0)
    return out


def _gaps_of_step_device(analysis):
    """Gaps of the GPU the training thread drives (the device whose processes include the steps' pid)."""
    if analysis.idle is None or not len(analysis.idle.gaps) or not analysis.idle.devices:
        return None
    for d in analysis.idle.devices:
        if analysis.steps.pid in d.pids:
            dev = d
            break
    else:
        dev = max(analysis.idle.devices, key=lambda d: d.busy_ns)
    return analysis.idle.gaps[analysis.idle.gaps["device_id"] == dev.device_id]


def _json(analysis) -> dict:
    bd = analysis.step_breakdown
    if bd is None:
        return {"step_breakdown": None}
    out = bd.astype(object)
    for col in ("duration_ns", *GPU_PARTS, "cpu_ns"):  # NaN: not measured in this report (null, never 0)
        out[col] = [None if pd.isna(v) else int(round(v)) for v in bd[col]]
    return {"step_breakdown": out}


QUESTION = Question(
    name="step_breakdown", order=107, run=_run, needs=("steps", "idle", "communication"),
    json_keys=("step_breakdown",), json_at=65, to_json=_json,
    tables=lambda analysis: {"step_breakdown": analysis.step_breakdown} if analysis.step_breakdown is not None else {},
)
