"""Start-up: from the trace's start to the first training step, with its own breakdown.

Start-up happens once (CUDA context and module loading, pinned host allocations, the model's
upload, cuDNN/cuBLAS autotuning, the first batch); it never yields a per-step finding or fix.
Its parts are measured from the calls the one runtime pass already holds (calls of at least
SLOW_API_NS, copies and syncs) and the GPU operations before the first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import SLOW_API_NS, api_base_name

# What a slow CUDA call in start-up is, by its name (the first matching group wins).
GROUPS = (
    ("CUDA context and module loading", ("cuInit", "cuDevicePrimaryCtx", "cuCtx", "cuModule", "cuLibrary",
                                         "cudaFree", "cudaSetDevice", "cudaGetDevice", "cuGetProcAddress",
                                         "cudaDeviceGetAttribute", "cuKernelGet")),
    ("pinned host allocations", ("cudaHostAlloc", "cudaMallocHost", "cuMemHostAlloc", "cudaHostRegister")),
    ("device allocations", ("cudaMalloc", "cuMemAlloc", "cuMemCreate", "cuMemMap")),
    ("copies and syncs", ("cudaMemcpy", "cuMemcpy", "Synchronize", "cudaStreamWait", "cudaEventSynchronize")),
)


@dataclass
class Startup:
    start_ns: int
    end_ns: int
    gpu_busy_ns: int
    parts: dict[str, int] = field(default_factory=dict)  # group -> CPU time in slow CUDA calls of that kind

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def to_dict(self) -> dict:
        return {"start_ns": self.start_ns, "end_ns": self.end_ns, "duration_ns": self.duration_ns,
                "gpu_busy_ns": self.gpu_busy_ns, "slow_cuda_calls_ns": self.parts}


def analyze_startup(trace, first_step_ns: int, busy, step_ns: float) -> Startup | None:
    """Start-up of a trace whose first step begins at ``first_step_ns``; None when it is shorter than one
    step (``step_ns``): a capture window that opens at a step boundary has no start-up."""
    lo = trace.bounds[0]
    if first_step_ns - lo < step_ns:
        return None
    gpu_busy = int(iv.Coverage(busy).measure(lo, first_step_ns)) if busy is not None else 0
    parts: dict[str, int] = {}
    calls = trace.api_calls(min_duration_ns=SLOW_API_NS) if trace.reader.has_cuda_api() else None
    if calls is not None and len(calls):
        s = np.clip(calls["start_ns"].to_numpy(), lo, first_step_ns)  # only what falls inside start-up
        e = np.clip(calls["end_ns"].to_numpy(), lo, first_step_ns)
        names = trace.api_names
        for name_id, dur in zip(calls["name_id"].to_numpy(), e - s):
            if dur <= 0:
                continue
            base = api_base_name(names.get(int(name_id), ""))
            group = next((g for g, prefixes in GROUPS if base.startswith(prefixes)), "other slow CUDA calls")
            parts[group] = parts.get(group, 0) + int(dur)
    return Startup(start_ns=int(lo), end_ns=int(first_step_ns), gpu_busy_ns=gpu_busy,
                   parts=dict(sorted(parts.items(), key=lambda kv: -kv[1])))


LAZY_LOADING = ("cuModuleLoad", "cuLibraryLoad", "cuModuleGetFunction", "cuLibraryGetKernel")
FIRST_TIME_NS = 1_000_000  # a step that loads this much GPU code ran code paths for the first time


def first_time_code_ns(trace, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per step, CPU time in slow calls that load GPU code (CUDA loads modules lazily, on a kernel's first
    launch): a step that holds them is still warming up, however close its length is to the others'."""
    if not trace.reader.has_cuda_api():
        return np.zeros(len(starts), dtype=np.int64)
    calls = trace.api_calls(min_duration_ns=SLOW_API_NS)
    names = trace.api_names
    mask = np.array([api_base_name(names.get(int(i), "")).startswith(LAZY_LOADING) for i in calls["name_id"]],
                    dtype=bool)  # a typed mask: an empty list would select no columns
    loading = calls.loc[mask]
    return iv.Coverage(iv.union(loading["start_ns"].to_numpy(), loading["end_ns"].to_numpy())).measure(starts, ends)
