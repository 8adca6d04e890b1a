"""Host-to-device copies from pageable (unpinned) memory.

The driver stages pageable copies through a pinned bounce buffer, so the
"async" copy blocks the CPU thread and moves at a fraction of pinned speed.
``pin_memory=True`` on the DataLoader plus ``.to(device, non_blocking=True)``
fixes both. Memory kinds come from the report's own ENUM table (Pageable is
0 there, not CUPTI's numbering).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.trace.attribution import attribute, range_labels
from nvtx_trace.analyzer.trace.tables import Trace


@dataclass
class PageableResult:
    """Totals over ``copies``; ``within()`` narrows them to the copies made inside training steps."""

    count: int
    bytes: int
    time_ns: int
    api_ns: int  # CPU time blocked in the calls that issued them
    pinned_count: int
    pinned_bytes: int
    pinned_time_ns: int
    by_source: pd.DataFrame  # range, where (file:line or None), api, count, bytes, time_ns, api_ns
    copies: pd.DataFrame = None  # one row per pageable copy: start_ns, end_ns, bytes, duration_ns, api_ns, range, api

    @property
    def bandwidth_gbps(self) -> float:
        return self.bytes / self.time_ns if self.time_ns else 0.0  # bytes/ns == GB/s

    @property
    def pinned_bandwidth_gbps(self) -> float:
        return self.pinned_bytes / self.pinned_time_ns if self.pinned_time_ns else 0.0


def launch_filter(trace: Trace) -> tuple[str, str, list[int]] | None:
    """Host-to-device copies as a launch request (table, column, copy kinds); None when the kind is unknown."""
    htod = trace.reader.htod_copy_kind()
    if htod is None:
        return None
    return ("memcpy", "copy_kind", [htod])


def analyze_pageable(trace: Trace) -> PageableResult | None:
    r = trace.reader
    request = launch_filter(trace)
    pageable, pinned = r.memory_kind("pageable"), r.memory_kind("pinned")
    if request is None or pageable is None:
        return None
    copies = trace.launches_of(*request)
    copies["duration_ns"] = copies["end_ns"] - copies["start_ns"]
    page = copies[copies["src_kind"] == pageable].reset_index(drop=True)
    pin = copies[copies["src_kind"] == pinned]
    page["api_ns"] = np.where(page["api_start_ns"] >= 0, page["api_end_ns"] - page["api_start_ns"], 0)
    page["range"], page["api"] = _sources(trace, page)
    page = page[["start_ns", "end_ns", "bytes", "duration_ns", "api_ns", "range", "api"]]
    return replace(_totals(page, None), pinned_count=int(len(pin)), pinned_bytes=int(pin["bytes"].sum()),
                   pinned_time_ns=int(pin["duration_ns"].sum()))


def _totals(page: pd.DataFrame, like: PageableResult | None) -> PageableResult:
    base = like or PageableResult(0, 0, 0, 0, 0, 0, 0, pd.DataFrame())
    return replace(base, count=int(len(page)), bytes=int(page["bytes"].sum()), time_ns=int(page["duration_ns"].sum()),
                   api_ns=int(page["api_ns"].sum()), by_source=_by_source(page), copies=page)


def within(result: PageableResult, windows: list[tuple[int, int]]) -> PageableResult:
    """The same figures for copies that started inside the given windows (the training steps)."""
    c = result.copies
    if not windows or c is None:
        return result
    lo = np.array([w[0] for w in windows])
    hi = np.array([w[1] for w in windows])
    i = np.searchsorted(lo, c["start_ns"].to_numpy(), side="right") - 1
    inside = (i >= 0) & (c["start_ns"].to_numpy() < hi[np.maximum(i, 0)])
    return _totals(c[inside].reset_index(drop=True), result)


def _sources(trace: Trace, page: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each copy: the NVTX range it was issued from (through its CUDA call) and that call's name."""
    if not len(page):
        return np.empty(0, dtype=object), np.empty(0, dtype=object)
    has_api = page["api_start_ns"].to_numpy() >= 0
    idx, _ = attribute(np.where(has_api, page["api_start_ns"], page["start_ns"]), page["api_gtid"].to_numpy(),
                       page["pid"].to_numpy(), trace.ranges)
    api = [trace.api_names.get(int(i), "(no CUDA call recorded)") for i in page["api_name_id"]]
    return range_labels(trace.ranges, idx), np.array(api, dtype=object)


def _by_source(page: pd.DataFrame) -> pd.DataFrame:
    cols = ["range", "where", "api", "count", "bytes", "time_ns", "api_ns"]
    if not len(page):
        return pd.DataFrame(columns=cols)
    out = page.groupby(["range", "api"], as_index=False).agg(
        count=("bytes", "size"), bytes=("bytes", "sum"), time_ns=("duration_ns", "sum"), api_ns=("api_ns", "sum"))
    # the line of the user's code that copied (nvtx_autotrace's `copy.h2d ... at FILE:LINE`), where named
    out["where"] = out["range"].str.extract(_AT_LINE, expand=False).astype(object)
    out["where"] = out["where"].where(out["where"].notna(), None)
    return out[cols].sort_values("time_ns", ascending=False, ignore_index=True)


_AT_LINE = r"^copy\.h2d .* at (.+:\d+)$"


def per_step(analysis):
    """Pageable copies inside the steady training steps (the window every finding is measured in), and the
    scope in words: copies outside the steps (loading the model) happen once, so they are worth neither a
    finding nor pinning advice."""
    if analysis.pageable and analysis.steps and len(analysis.steps.steady):
        steady = analysis.steps.steady
        return within(analysis.pageable, list(zip(steady["start_ns"], steady["end_ns"]))), "inside the steady steps"
    return analysis.pageable, "in the whole trace"
