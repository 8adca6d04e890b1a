"""Interval arithmetic against a brute-force bitmap on random inputs (exact, integer nanoseconds)."""

from __future__ import annotations

import numpy as np
import pytest

from nvtx_trace.analyzer.trace import intervals as iv

HORIZON = 300


def bitmap(starts, ends):
    m = np.zeros(HORIZON, bool)
    for s, e in zip(starts, ends):
        m[s:e] = True
    return m


def random_set(rng, n_max=30):
    n = int(rng.integers(0, n_max))
    s = rng.integers(0, 250, n)
    return s, s + rng.integers(0, 40, n)


@pytest.mark.parametrize("seed", range(40))
def test_set_operations_equal_bitmap_logic(seed):
    rng = np.random.default_rng(seed)
    a_raw, b_raw = random_set(rng), random_set(rng)
    A, B = bitmap(*a_raw), bitmap(*b_raw)
    a, b = iv.union(*a_raw), iv.union(*b_raw)
    assert (bitmap(*a) == A).all() and iv.total(a) == A.sum()
    assert (bitmap(*iv.intersect(a, b)) == (A & B)).all()
    assert (bitmap(*iv.subtract(a, b)) == (A & ~B)).all()
    assert (bitmap(*iv.merge(a, b)) == (A | B)).all()
    lo = rng.integers(0, HORIZON, 20)
    hi = np.minimum(lo + rng.integers(0, 60, 20), HORIZON)
    assert (iv.Coverage(a).measure(lo, hi) == [A[x:y].sum() for x, y in zip(lo, hi)]).all()
    for s, e in zip(*iv.holes(a, min_len=3)):
        assert e - s >= 3 and not A[s:e].any()


def test_union_is_disjoint_and_sorted_and_touching_blocks_merge():
    s, e = iv.union([5, 0, 10, 3], [8, 3, 12, 4])
    assert s.tolist() == [0, 5, 10] and e.tolist() == [4, 8, 12]


def test_holes_respect_min_len_and_bounds():
    a = iv.union([0, 10, 30], [5, 12, 31])
    assert [list(x) for x in iv.holes(a, min_len=6)] == [[12], [30]]
    assert [list(x) for x in iv.holes(a, lo=-5, hi=40, min_len=5)] == [[-5, 5, 12, 31], [0, 10, 30, 40]]


def test_innermost_picks_the_deepest_open_range_per_group():
    #  0 [------------------------------) 30      group 0
    #     1 [---) 5    10 [----) 15
    #       2 [) 3        11 [) 12
    starts = [0, 1, 2, 10, 11, 20, 0]
    ends = [30, 5, 3, 15, 12, 25, 100]
    groups = [0, 0, 0, 0, 0, 0, 1]
    q = [0, 2, 4, 6, 11, 13, 21, 31, 50]
    got = iv.innermost(starts, ends, groups, q, [0, 0, 0, 0, 0, 0, 0, 0, 1])
    assert got.tolist() == [0, 2, 1, 0, 4, 3, 5, -1, 6]
