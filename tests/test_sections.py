"""Every analysis unit's report section is registered under a unit that exists, and the terminal report
states the analysis window once, on every sample report."""

from __future__ import annotations

import io

import pytest
from conftest import SAMPLES
from rich.console import Console

from nvtx_trace.analyzer import analyze
from nvtx_trace.analyzer.units import UNITS
from nvtx_trace.report import text
from nvtx_trace.report.sections import SECTIONS

SAMPLE_PATHS = sorted(SAMPLES.glob("*.sqlite"))


def test_every_section_belongs_to_a_unit():
    assert set(SECTIONS) <= {u.name for u in UNITS}


@pytest.mark.parametrize("report", SAMPLE_PATHS, ids=[p.stem for p in SAMPLE_PATHS])
def test_the_window_is_stated_once(report):
    a = analyze(report)
    out = io.StringIO()
    text.render(a, Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("Window: ") for line in lines) == 1
    assert sum(a.window["source"] in line for line in lines) == 1  # not repeated in tables or findings
