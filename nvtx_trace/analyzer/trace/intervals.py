"""Vectorized interval arithmetic on sorted numpy arrays: the one place for union, gaps and overlap.

A *set* is a pair of int64 arrays ``(starts, ends)``, sorted and disjoint,
as returned by :func:`union`. Everything here is O(n log n) numpy: no Python
loop runs per interval, so millions of kernels cost well under a second.

    ops:   [==)  [====)                      union -> [======)    [==)
              [==)         [==)              gaps (min 1) ->  ^^^^ between
"""

from __future__ import annotations

import numpy as np

Set = tuple[np.ndarray, np.ndarray]


def empty() -> Set:
    return np.empty(0, np.int64), np.empty(0, np.int64)


def union(starts, ends) -> Set:
    """Merge possibly overlapping intervals into a sorted disjoint set (touching ones merge)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it has ended.
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_block)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def total(a: Set) -> int:
    return int((a[1] - a[0]).sum())


def holes(a: Set, lo: int | None = None, hi: int | None = None, min_len: int = 1) -> Set:
    """Gaps between the blocks of ``a`` (within ``[lo, hi]`` when given) at least ``min_len`` long."""
    s, e = a
    if s.size == 0:
        return empty()
    gs = e[:-1]
    ge = s[1:]
    if lo is not None and lo < s[0]:
        gs, ge = np.append(lo, gs), np.append(s[0], ge)
    if hi is not None and hi > e[-1]:
        gs, ge = np.append(gs, e[-1]), np.append(ge, hi)
    keep = (ge - gs) >= max(min_len, 1)
    return gs[keep], ge[keep]


def _combine(a: Set, b: Set, want) -> Set:
    """Boundary sweep over two disjoint sets; ``want(in_a, in_b)`` picks the regions to keep."""
    if a[0].size == 0 and b[0].size == 0:
        return empty()
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(a[0].size), -np.ones(a[1].size), np.zeros(b[0].size * 2)]).astype(np.int64)
    db = np.concatenate([np.zeros(a[0].size * 2), np.ones(b[0].size), -np.ones(b[1].size)]).astype(np.int64)
    order = np.argsort(t, kind="stable")
    t, da, db = t[order], da[order], db[order]
    # Collapse equal timestamps so [1,2) and [2,3) neither overlap nor leave a hole.
    uniq, idx = np.unique(t, return_index=True)
    ca = np.cumsum(da)[np.append(idx[1:] - 1, t.size - 1)]
    cb = np.cumsum(db)[np.append(idx[1:] - 1, t.size - 1)]
    inside = want(ca[:-1] > 0, cb[:-1] > 0)
    starts, ends = uniq[:-1][inside], uniq[1:][inside]
    return union(starts, ends)


def intersect(a: Set, b: Set) -> Set:
    return _combine(a, b, lambda x, y: x & y)


def subtract(a: Set, b: Set) -> Set:
    return _combine(a, b, lambda x, y: x & ~y)


def merge(a: Set, b: Set) -> Set:
    return union(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


class Coverage:
    """Answers "how much of [lo, hi) does this set cover?" for many windows at once, in O(log n) each."""

    def __init__(self, a: Set):
        self.s, self.e = a
        self.before = np.concatenate([[0], np.cumsum(self.e - self.s)])  # covered length before block i

    def _covered_until(self, t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.s, t, side="right")  # blocks starting at or before t
        j = np.maximum(i - 1, 0)
        partial = np.clip(t - self.s[j], 0, self.e[j] - self.s[j])
        return np.where(i > 0, self.before[j] + partial, 0)

    def measure(self, lo, hi) -> np.ndarray:
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.asarray(hi, dtype=np.int64)
        if self.s.size == 0:
            return np.zeros(np.broadcast(lo, hi).shape, dtype=np.int64)
        return self._covered_until(hi) - self._covered_until(lo)


SCAN_BACK = 64  # how many of the latest-started ranges to try before relying on nesting


def innermost(starts, ends, groups, q_time, q_group) -> np.ndarray:
    """Index of the latest-started interval of the same group containing each query time, or -1.

    Two passes. First, try the last ``SCAN_BACK`` intervals that started before t,
    newest first: this is exact for intervals that do not nest (start/end ranges,
    such as nvtx_autotrace's backward-hook ranges, overlap at their edges). Then,
    for queries still unanswered, rely on nesting (push/pop ranges on one thread
    nest): the innermost open range at t is the last one opened at the nesting
    depth current at t, so one searchsorted per depth level answers it.
    """
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    groups = np.asarray(groups, np.int64)
    q_time = np.asarray(q_time, np.int64)
    q_group = np.asarray(q_group, np.int64)
    out = np.full(q_time.size, -1, dtype=np.int64)
    if starts.size == 0 or q_time.size == 0:
        return out
    for g in np.unique(q_group):
        sel = np.flatnonzero(groups == g)
        qsel = np.flatnonzero(q_group == g)
        if sel.size == 0:
            continue
        order = sel[np.lexsort((-ends[sel], starts[sel]))]  # by start, outer (longer) first on ties
        s, e = starts[order], ends[order]
        sorted_s, sorted_e = s, np.sort(e)
        # Depth of each range = ranges open just before it starts.
        depth = np.arange(s.size) - np.searchsorted(sorted_e, s, side="right")
        t = q_time[qsel]
        found = _scan_back(s, e, t)
        hit = found >= 0
        out[qsel[hit]] = order[found[hit]]
        qsel, t = qsel[~hit], t[~hit]
        if not qsel.size:
            continue
        open_at_t = np.searchsorted(sorted_s, t, side="right") - np.searchsorted(sorted_e, t, side="left")
        qd = open_at_t - 1  # depth of the innermost open range
        for d in np.unique(qd[qd >= 0]):
            at_d = np.flatnonzero(depth == d)
            qi = np.flatnonzero(qd == d)
            j = np.searchsorted(s[at_d], t[qi], side="right") - 1
            ok = j >= 0
            cand = at_d[np.maximum(j, 0)]
            ok &= (s[cand] <= t[qi]) & (e[cand] >= t[qi])
            out[qsel[qi[ok]]] = order[cand[ok]]
    return out


def _scan_back(s: np.ndarray, e: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each t, the highest index i (s sorted) among the last SCAN_BACK with s[i] <= t <= e[i], or -1."""
    k = np.searchsorted(s, t, side="right") - 1
    out = np.full(t.size, -1, dtype=np.int64)
    todo = np.flatnonzero(k >= 0)
    for step in range(SCAN_BACK):
        if not todo.size:
            break
        i = k[todo] - step
        valid = i >= 0
        todo, i = todo[valid], i[valid]
        hit = e[i] >= t[todo]
        out[todo[hit]] = i[hit]
        todo = todo[~hit]
    return out
