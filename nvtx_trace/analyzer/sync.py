"""Blocking host syncs (``.item()``, ``.cpu()``, ``cudaStreamSynchronize`` ...) and where they come from.

A sync is not slow by itself (the GPU is busy meanwhile); its cost is that the
CPU stops queueing work, so the GPU runs dry and then waits for Python. That
idle time is measured in gpu_idle as the "sync" cause; here we list the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.attribution import attribute, range_labels
from nvtx_trace.analyzer.trace.tables import SYNC_API_RE, Trace


@dataclass
class SyncResult:
    calls: pd.DataFrame  # start_ns, end_ns, gtid, pid, name, range (the innermost NVTX range around each)
    by_source: pd.DataFrame  # api, range, count, blocked_ns
    per_step: dict = field(default_factory=dict, repr=False)  # locations()/implicit() of one window, made once

    @property
    def wait_set(self) -> iv.Set:
        return iv.union(self.calls["start_ns"].to_numpy(), self.calls["end_ns"].to_numpy())

    @property
    def count(self) -> int:
        return int(len(self.calls))

    @property
    def blocked_ns(self) -> int:
        return iv.total(self.wait_set)


def _of(sync: SyncResult, window: tuple[int, int] | None, pid: int | None) -> pd.DataFrame:
    """The sync calls begun in ``window`` by process ``pid`` (either None: all)."""
    calls = sync.calls
    if window is not None:
        calls = calls[(calls["start_ns"] >= window[0]) & (calls["start_ns"] < window[1])]
    if pid is not None and "pid" in calls:
        calls = calls[calls["pid"] == pid]
    return calls


def locations(sync: SyncResult, window: tuple[int, int] | None, steps: int, pid: int | None = None) -> pd.DataFrame:
    """The lines that asked for a sync (nvtx_autotrace's ``sync WHAT at FILE:LINE`` ranges), in the window of
    the training process: what, where, calls and the time the host was blocked, per steady step; largest
    first. Empty without such ranges (captured before they named their line, or not under nvtx_autotrace)."""
    cols = ["what", "where", "count_per_step", "blocked_ns_per_step"]
    calls = _of(sync, window, pid)
    found = calls["range"].astype(str).str.extract(names.SYNC_SITE_RE) if len(calls) else None
    if found is None or found["where"].isna().all() or steps <= 0:
        return pd.DataFrame(columns=cols)
    rows = pd.DataFrame({"what": found["what"], "where": found["where"],
                         "blocked": (calls["end_ns"] - calls["start_ns"]).to_numpy()}).dropna(subset=["where"])
    out = rows.groupby(["what", "where"], as_index=False).agg(count=("blocked", "size"), blocked=("blocked", "sum"))
    out["count_per_step"] = out["count"] / steps
    out["blocked_ns_per_step"] = out["blocked"] / steps
    return out.sort_values("blocked_ns_per_step", ascending=False, ignore_index=True)[cols]


def implicit(sync: SyncResult, window: tuple[int, int] | None, steps: int, pid: int | None = None) -> pd.DataFrame:
    """The blocking calls no wrapper named (``data[mask]``, ``nonzero``, one-argument ``torch.where``, a
    library's own ``cudaStreamSynchronize``): no Python line, so the innermost range they ran in, per steady step;
    largest first. Calls inside nvtx_autotrace's sync and copy ranges, and cudaFree (the allocator's), are not
    these. Empty without sync-site ranges in the report: there every call would be implicit."""
    cols = ["api", "range", "count_per_step", "blocked_ns_per_step"]
    calls = _of(sync, window, pid)
    labels = calls["range"].astype(str)
    if steps <= 0 or not labels.str.match(names.SYNC_SITE_RE).any():
        return pd.DataFrame(columns=cols)
    named = labels.str.match(names.SYNC_RE) | labels.str.startswith(("copy.", "pin_memory"))
    api = calls["name"].astype(str)
    keep = ~named & ~api.str.match(r"^(cudaFree|cuMemFree)")
    rows = pd.DataFrame({"api": api[keep].str.replace(r"_v\d+$", "", regex=True), "range": labels[keep],
                         "blocked": (calls["end_ns"] - calls["start_ns"])[keep]})
    if not len(rows):
        return pd.DataFrame(columns=cols)
    out = rows.groupby(["api", "range"], as_index=False).agg(count=("blocked", "size"), blocked=("blocked", "sum"))
    out["count_per_step"] = out["count"] / steps
    out["blocked_ns_per_step"] = out["blocked"] / steps
    return out.sort_values("blocked_ns_per_step", ascending=False, ignore_index=True)[cols]


def analyze_sync(trace: Trace) -> SyncResult:
    calls = trace.api_calls(SYNC_API_RE)
    calls = calls.sort_values("start_ns", ignore_index=True)
    ranges = trace.ranges
    idx, _ = attribute(calls["start_ns"].to_numpy(), calls["gtid"].to_numpy(), calls["pid"].to_numpy(), ranges) \
        if len(calls) else (np.empty(0, np.int64), None)
    labels = range_labels(ranges, idx)
    calls = calls.assign(range=labels)
    df = pd.DataFrame({"api": calls["name"].astype(str).to_numpy(),
                       "range": labels,
                       "blocked_ns": (calls["end_ns"] - calls["start_ns"]).to_numpy()})
    by_source = df.groupby(["api", "range"], as_index=False).agg(count=("blocked_ns", "size"),
                                                                 blocked_ns=("blocked_ns", "sum"))
    return SyncResult(calls=calls, by_source=by_source.sort_values("blocked_ns", ascending=False, ignore_index=True))
