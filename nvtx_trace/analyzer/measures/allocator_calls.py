"""cudaFree/cudaMalloc in the steady window: whether they make an allocator finding, read by two questions (the
allocator's raises it; the sync finding leaves cudaFree's time out where it does, so the two stay disjoint)."""

from __future__ import annotations

import re
from collections.abc import Mapping

FREE_RE = re.compile(r"^(cudaFree|cuMemFree)(_v\d+)?$")


def churns(allocator: dict | None, gpu_ns: float, thresholds: Mapping) -> bool:
    """Calls at least every other step, their time above the common thresholds (``findings.THRESHOLDS``)."""
    if not allocator or allocator["calls"] < 0.5 * allocator["steps"]:
        return False
    t = allocator["time_ns"]
    return t >= thresholds["min_impact_ns"] and t >= thresholds["cause_fraction"] * gpu_ns


def freed_ns(allocator: dict | None, gpu_ns: float, thresholds: Mapping) -> int:
    """The training thread's time in cudaFree that an allocator finding counts (0 when it raises none)."""
    return allocator["free_ns"] if churns(allocator, gpu_ns, thresholds) else 0
