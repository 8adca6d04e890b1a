"""Step times of two kinds are described as two kinds, never hidden behind one median."""

from __future__ import annotations

import numpy as np
from conftest import ROOT

from nvtx_trace.analyzer import analyze
from nvtx_trace.analyzer.measures.step_times import two_modes

MS = 1_000_000


def test_alternating_steps_are_two_modes():
    d = np.array([3, 155, 3.2, 150, 2.9, 160, 3.1, 158] * 2) * MS
    modes = two_modes(d)
    assert modes == {"low_ns": int(np.median(d[d < 100 * MS])), "high_ns": int(np.median(d[d > 100 * MS])),
                     "low_steps": 8, "high_steps": 8}


def test_spread_steps_and_one_outlier_are_not():
    assert two_modes(np.array([2.7, 2.8, 4.0, 9.7, 15.3, 15.9, 20.4, 25.5, 44.4, 57.2, 65.2]) * MS) is None
    assert two_modes(np.array([120.0] * 20 + [900.0]) * MS) is None  # one slow step (a checkpoint) is no mode
    assert two_modes(np.array([5.0, 50.0]) * MS) is None  # too few steps to tell


def test_sample_reports_with_one_kind_of_step_say_nothing_of_modes():
    for name in ("resnet_flawed.sqlite", "cpu_slow_loader.sqlite"):
        assert analyze(ROOT / "sample_reports" / name).steps.summary()["modes"] is None
