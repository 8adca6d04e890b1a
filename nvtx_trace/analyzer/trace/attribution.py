"""Which NVTX range a GPU operation belongs to, through the CPU call that launched it.

NVIDIA's projection only looks at ranges on the launching thread. Backward
kernels are launched by PyTorch's autograd thread (``pt_autograd_0``) while
the ``backward`` range sits on the main thread, so that misses them. When the
launching thread has no matching range open, fall back to the innermost
matching range open at launch time on any thread of the same process.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.trace import intervals as iv


def _fold(name: str) -> str:
    """Names that differ only by a counter or a size fold into one label."""
    if names.STEP_RE.match(name):
        return "step N"
    m = names.H2D_COPY_RE.match(name)
    if m:
        return (f"copy.h2d ({m.group('kind')}, non_blocking={m.group('nb')})"
                + (f" at {m.group('where')}" if m.group("where") else ""))
    return name


def range_labels(ranges: pd.DataFrame, idx: np.ndarray, none: str = "(no enclosing range)") -> np.ndarray:
    """Display names for attributed ranges; every ``step N`` folds into one ``step N`` label."""
    if not len(ranges) or not len(idx):
        return np.full(len(idx), none, dtype=object)
    labels = ranges["name"].astype(object).to_numpy()[np.maximum(idx, 0)]
    labels = np.array([_fold(str(x)) for x in labels], dtype=object)
    return np.where(idx >= 0, labels, none)


def attribute(launch_t: np.ndarray, launch_gtid: np.ndarray, launch_pid: np.ndarray,
              ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Index into ``ranges`` (or -1) of the range each launch belongs to, and whether it came from the fallback."""
    launch_t = np.asarray(launch_t, np.int64)
    out = np.full(launch_t.size, -1, dtype=np.int64)
    fallback = np.zeros(launch_t.size, dtype=bool)
    if not len(ranges) or not launch_t.size:
        return out, fallback
    r_start = ranges["start_ns"].to_numpy()
    r_end = ranges["end_ns"].to_numpy()
    r_gtid = ranges["gtid"].to_numpy()
    out = iv.innermost(r_start, r_end, r_gtid, launch_t, np.asarray(launch_gtid, np.int64))
    missing = np.flatnonzero(out < 0)
    if missing.size:
        r_pid = ranges["pid"].to_numpy()
        best = np.full(missing.size, -1, dtype=np.int64)
        for gtid in np.unique(r_gtid[np.isin(r_pid, np.asarray(launch_pid)[missing])]):
            same_thread = np.zeros(missing.size, np.int64) + gtid
            cand = iv.innermost(r_start, r_end, r_gtid, launch_t[missing], same_thread)
            ok = (cand >= 0) & (r_pid[np.maximum(cand, 0)] == np.asarray(launch_pid)[missing])
            later = ok & ((best < 0) | (r_start[np.maximum(cand, 0)] > r_start[np.maximum(best, 0)]))
            best[later] = cand[later]
        out[missing] = best
        fallback[missing] = best >= 0
    return out, fallback
