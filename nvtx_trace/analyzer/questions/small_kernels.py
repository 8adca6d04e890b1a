"""Are most kernels too small to fill the GPU (fewer thread blocks than it has SMs), with memory to spare?

A kernel of fewer blocks than SMs leaves SMs idle however long it runs (``torch.zeros(1000, device="cuda")``
is 4 blocks on a GPU with 132 SMs). When most of the GPU's compute is such kernels and memory allows, a larger
batch does more work per step in about the same time. Not predicted as a step: a larger batch changes the
work of a step (compare samples per second).
"""

from __future__ import annotations

from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import pct


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns or not k.under_one_wave:
        return []
    small = k.under_one_wave["non_matrix_time_ns"]
    if small < THRESHOLDS["small_kernels_share"] * k.compute_ns or small < THRESHOLDS["min_impact_ns"]:
        return []
    s = analysis.settings or {}
    total, peak = (s.get("device") or {}).get("memory_total_bytes"), s.get("device_peak_allocated_bytes")
    if total and peak is not None and peak > THRESHOLDS["small_kernels_memory_share"] * total:
        return []  # no room for a larger batch
    room = (f"peak {peak / 2**30:.1f} of {total / 2**30:.0f} GiB allocated (recorded)" if total and peak is not None
            else "memory headroom unknown (no settings record)")
    return [Finding(
        kind="small_kernels",
        title=f"Kernels too small to fill the GPU: {pct(small / k.compute_ns)} of its compute in the window ran "
              f"fewer thread blocks than it has SMs ({k.under_one_wave['non_matrix_count']:,} kernels, GEMMs, "
              f"convolutions and attention aside: their libraries launch few blocks that loop over tiles); {room}",
        impact_ns=int(small),
        fix="Use a larger batch (or fewer, larger operations: batch small matmuls, concatenate inputs); memory "
            "allows it. Compare samples per second, not step time: a larger batch changes the work of a step. "
            "No prediction of the step.",
        recommend={"larger_batch": True},
        threshold=f">= {pct(THRESHOLDS['small_kernels_share'])} of the GPU's compute in kernels under one wave, and "
                  f"peak memory <= {pct(THRESHOLDS['small_kernels_memory_share'])} of the GPU's where recorded",
        evidence={**k.under_one_wave, "compute_ns": k.compute_ns, "peak_allocated_bytes": peak,
                  "memory_total_bytes": total, "facts": facts(analysis)},
    )]


QUESTION = Question(
    name="small_kernels", order=120, needs=("kernels", "settings"),
    thresholds={"small_kernels_share": 0.5,  # most of the GPU's compute in kernels under one wave
                "small_kernels_memory_share": 0.5},  # ... and at most half the GPU's memory used
    findings=_findings,
)
