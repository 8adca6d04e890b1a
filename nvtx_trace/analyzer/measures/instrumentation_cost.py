"""What nvtx_autotrace's own ranges cost the program, from the trace itself.

The profiled process measures its per-range costs once, under the profiler
(nvtx_autotrace/budget.py), and writes them into the trace as one range
``nvtx_autotrace.instrumentation {json}``. Here those unit costs are multiplied
by the ranges actually recorded in the steady-state steps of the training
process, so the figure follows what really ran (grad accumulation, eval passes,
copies) rather than a constant. Findings about CPU time (cpu_overhead,
launch-bound gaps) subtract it or name it (basis.py, questions/cpu_bound.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.trace.tables import name_mask

MAX_TRACE_COST_NS = 30_000  # most the profiler can add per traced GPU operation or range (H100 VM: ~10 µs)


@dataclass
class Instrumentation:
    ranges_per_step: float  # nvtx_autotrace ranges per steady step, training process, every thread
    cost_ns_per_step: float | None  # their measured CPU cost per step; None when the report carries no calibration
    method: str
    settings: dict = field(default_factory=dict)  # what the process measured and chose (depths, unit costs, budget)
    module_ranges_per_step: float = 0.0
    outside_capture_step_ns: float | None = None  # median step just before the capture window, same ranges
    profiler_cost_ns_per_step: float | None = None  # captured median - that: the profiler's own
    # why a difference was not claimed (one of the two, set to the bound it broke):
    profiler_gpu_idle_ns_per_step: float | None = None  # the GPU's idle (and collective-wait) time per step
    profiler_traced_per_step: float | None = None  # the traced events per step, at MAX_TRACE_COST_NS each

    def to_dict(self) -> dict:
        return {"ranges_per_step": self.ranges_per_step, "cost_ns_per_step": self.cost_ns_per_step,
                "method": self.method, "settings": self.settings}

    def profiler_dict(self) -> dict | None:
        """summary.json ``profiler``: the profiler's own measured cost, or None where it was not measured."""
        if self.outside_capture_step_ns is None:
            return None
        return {"outside_capture_step_ns": self.outside_capture_step_ns,
                "cost_ns_per_step": self.profiler_cost_ns_per_step}

    def compare_with_capture(self, captured_step_ns: float | None, traced_per_step: float,
                             gpu_idle_per_step_ns: float | None = None) -> None:
        """Set the profiler's own cost per step: the captured steps' median against the reference steps the
        process timed just before the window opened (same program, same ranges, no CUDA/API tracing yet).

        Under nsys, CUDA tracing adds µs to every launch; a program that was GPU-bound can turn launch-bound
        in the capture (GPT-2 small on an H100: 113 ms plain, 165-206 ms captured, 12.5 µs per traced
        cudaLaunchKernel). Two bounds keep other causes out; a difference beyond either is not claimed:
        ``traced_per_step`` events (GPU operations and ranges) at MAX_TRACE_COST_NS each (a data loader's own
        jitter, say), and the GPU's idle time per captured step: tracing slows the host, so it can lengthen a
        step only by making the GPU wait for it (a ViT fp32 on an H200, 98 % busy: 92.65 ms before the capture
        and 97.03 ms in it as its clocks settled; plain, it ran 96.46 ms). ``captured_step_ns`` leaves out each
        step's waits for data, which are the loader's, not tracing's: steps before the capture can run on batches
        the workers prefetched while the loop warmed up (a Lightning program: 76.2 ms before the capture, 92.1 ms
        in it, 93.65 ms plain, 15.85 ms once claimed)."""
        ref = _unit(self.settings, "outside_capture_step_ns")
        if ref is None or not ref or captured_step_ns is None:
            return
        self.outside_capture_step_ns = ref
        diff = captured_step_ns - ref  # the ranges ran in the reference steps too
        if diff < 0:  # faster under capture: not measurable
            return
        if diff > traced_per_step * MAX_TRACE_COST_NS:
            self.profiler_traced_per_step = traced_per_step
            return
        if gpu_idle_per_step_ns is not None and diff > gpu_idle_per_step_ns:
            self.profiler_gpu_idle_ns_per_step = gpu_idle_per_step_ns
            return
        self.profiler_cost_ns_per_step = diff


def read_record(ranges: pd.DataFrame, prefix: str = names.INSTRUMENTATION_PREFIX, pid: int | None = None) -> dict | None:
    """The last well-formed JSON record named ``prefix {json}`` in the trace (of process ``pid`` when it has
    one there), or None."""
    records = read_records(ranges, prefix, pid)
    return records[-1] if records else None


def read_records(ranges: pd.DataFrame, prefix: str, pid: int | None = None) -> list[dict]:
    """Every well-formed JSON record named ``prefix {json}``, in trace order (of process ``pid`` where it has
    some): the settings record is read as the last, the per-step memory records as all."""
    if not len(ranges):
        return []
    hit = name_mask(ranges["name"], lambda n: n.startswith(prefix))
    if pid is not None and "pid" in ranges and (hit & (ranges["pid"] == pid)).any():
        hit &= ranges["pid"] == pid
    out = []
    for text in ranges["name"][hit].astype(str).tolist():
        try:
            record = json.loads(text[len(prefix):])
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _unit(record: dict, key: str) -> float | None:
    v = record.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0 else None


def analyze_instrumentation(ranges: pd.DataFrame, window: tuple[int, int], pid: int | None,
                            steady_steps: int) -> Instrumentation | None:
    """Ranges per step and their cost in ``window`` (the steady steps of process ``pid``); None without ours."""
    if not len(ranges) or steady_steps <= 0:
        return None
    own = name_mask(ranges["name"], lambda n: names.is_auto_range(n) and not n.startswith(
        names.ONCE_RECORDS))
    start = ranges["start_ns"].to_numpy()
    inside = own & (start >= window[0]) & (start < window[1])
    if pid is not None:
        inside &= ranges["pid"].to_numpy() == pid
    record = read_record(ranges)
    ambiguous = name_mask(ranges["name"], lambda n: bool(names.STEP_RE.match(n)) or n == names.BACKWARD)
    steps_only = not (inside & ~ambiguous).any()
    if not inside.any() or (steps_only and record is None):
        return None  # nothing surely ours: a user's own `step N` and `backward` ranges read the same
    sel = ranges["name"][inside]
    forward = int(name_mask(sel, lambda n: n.startswith(names.FORWARD_PREFIX) and bool(names.MODULE_RE.match(n))).sum())
    backward = int(name_mask(sel, lambda n: n.startswith(names.BACKWARD_PREFIX) and bool(names.MODULE_RE.match(n))).sum())
    total = int(inside.sum())
    per_step = total / steady_steps
    if record is None:
        return Instrumentation(per_step, None, "unknown: the report carries no nvtx_autotrace calibration "
                                               "(captured before it existed, or ranges written by hand)",
                               {}, (forward + backward) / steady_steps)
    fwd, bwd, rng = (_unit(record, k) for k in ("module_forward_ns", "module_backward_ns", "range_ns"))
    cost = None
    if fwd is not None and bwd is not None and rng is not None:
        cost = (forward * fwd + backward * bwd + (total - forward - backward) * rng) / steady_steps
    method = str(record.get("method") or "nvtx_autotrace")
    return Instrumentation(per_step, cost, method, record, (forward + backward) / steady_steps)
