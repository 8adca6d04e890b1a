"""The figures every finding is measured against, computed once before any question builds its findings.

Idle time is summed over GPUs, so shares are of GPU time: the window times the number of GPUs. When the
CPU limits the loop, each ns the tool itself costs can idle the GPU for at most one ns: that cost is taken
out of CPU-bound idle (long gaps with a CPU cause and short gaps) pro rata (``keep``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms, pct

CPU_CAUSES = ("cuda_api", "optimizer", "backward", "forward", "other_range", "unattributed")


@dataclass
class Basis:
    window_ns: int  # the steady window's length (1 when there is none)
    gpu_ns: int  # the window times the number of GPUs
    cause_ns: dict  # idle in gaps >= --min-gap-ms inside the window, by cause, summed over GPUs
    short: dict  # per GPU: (idle in gaps shorter than --min-gap-ms, their count, their median length)
    keep: float  # share of CPU-bound idle left once the tool's own cost is taken out
    found: list[Finding] = field(default_factory=list)  # the findings built so far, in question order


def measure(analysis) -> Basis:
    window_ns = max(1, analysis.window.get("end_ns", 0) - analysis.window.get("start_ns", 0)) if analysis.window else 1
    causes = analysis.window_causes
    cause_ns = causes.groupby("cause")["idle_ns"].sum().to_dict() if causes is not None and len(causes) else {}
    gpu_ns = window_ns * max(1, len(analysis.idle.devices) if analysis.idle else 1)
    short = ({dev.device_id: short_idle(analysis, dev) for dev in analysis.idle.devices}
             if analysis.idle and analysis.window else {})
    keep = _after_own_cost(analysis, cause_ns, sum(s[0] for s in short.values()))
    return Basis(window_ns=window_ns, gpu_ns=gpu_ns, cause_ns=cause_ns, short=short, keep=keep)


def of_window(analysis, share: float) -> str:
    """"37 % of the window", or of the GPUs' time in it when there are several."""
    n = len(analysis.idle.devices) if analysis.idle else 1
    return f"{pct(share)} of the window" + (f" across {n} GPUs" if n > 1 else "")


def short_idle(analysis, dev):
    """Idle stretches shorter than --min-gap-ms (by full length), clipped to the window: (ns, count, median)."""
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    h0, h1 = iv.holes(dev.busy, min_len=1)
    inside = (h1 - h0 < analysis.min_gap_ns) & (h1 > w0) & (h0 < w1)
    short_idle = int((np.minimum(h1[inside], w1) - np.maximum(h0[inside], w0)).sum())
    n_short = int(inside.sum())
    return short_idle, n_short, float(np.median(h1[inside] - h0[inside])) if n_short else 0.0


def own_cost_ns(analysis) -> int:
    """CPU time the tool itself added in the analysis window: nvtx_autotrace's ranges (measured, see
    instrumentation.py) and, where the process timed steps just before the capture, the profiler's tracing."""
    inst = analysis.instrumentation
    if inst is None or not analysis.steps:
        return 0
    per_step = (inst.cost_ns_per_step or 0) + (inst.profiler_cost_ns_per_step or 0)
    return int(per_step * len(analysis.steps.steady) * max(1, len(analysis.idle.devices) if analysis.idle else 1))


def _after_own_cost(analysis, cause_ns: dict, short_idle_ns: int) -> float:
    own = own_cost_ns(analysis)
    if not own or not analysis.idle:
        return 1.0
    pool = sum(cause_ns.get(c, 0) for c in CPU_CAUSES)
    pool += short_idle_ns
    return max(0.0, 1.0 - own / pool) if pool else 1.0


def profiler_unmeasured(analysis) -> str:
    """Launch-bound figures measured under CUDA API tracing include the tracing's own cost per call, which
    only a run that timed its steps outside the capture can separate (nvtx_autotrace's capture window)."""
    inst = analysis.instrumentation
    if inst is not None and inst.outside_capture_step_ns is not None:
        return ""
    return ("; part of it may be the profiler's own CUDA tracing, which slows every launch and is not measured "
            "in this capture (nvtx-trace run with --warmup-steps and --steps times the steps before the capture "
            "and leaves that cost out)")


def own_cost_note(analysis, subtracted: int) -> str:
    inst = analysis.instrumentation
    if inst is not None and inst.cost_ns_per_step is None and inst.module_ranges_per_step >= 1:
        return (f" (this report carries {inst.module_ranges_per_step:.0f} nvtx_autotrace module ranges per step "
                "whose cost was not measured: it was captured before the instrumentation measured itself; "
                "capture it again to have that cost measured and left out)")
    if subtracted <= 0:
        return ""
    parts = []
    if inst.cost_ns_per_step:
        parts.append(f"nvtx_autotrace's ranges {ms(inst.cost_ns_per_step)}/step ({inst.ranges_per_step:.0f} ranges)")
    if inst.profiler_cost_ns_per_step:
        parts.append(f"the profiler's own tracing {ms(inst.profiler_cost_ns_per_step)}/step (steps took "
                     f"{ms(inst.outside_capture_step_ns)} just before the capture, without it)")
    return f" ({ms(subtracted)} of it is the tool's own measured cost: {' and '.join(parts)}; left out of the impact)"
