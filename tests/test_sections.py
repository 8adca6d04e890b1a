"""The terminal report states the analysis window once; each sample report's text, question by question, is in
tests/golden_questions (tests/test_golden_json.py compares them; `text_of` is the whole text as `analyze` prints it)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from conftest import SAMPLES, sample_analysis
from rich.console import Console

from nvtx_trace.report import text

SAMPLE_PATHS = sorted(SAMPLES.glob("*.sqlite"))


def text_of(report: Path) -> str:
    a = sample_analysis(report)
    a.path = report.name  # where the checkout lives is not text, nor where the header wraps
    out = io.StringIO()
    text.render(a, Console(file=out, width=120, color_system=None))
    return out.getvalue().replace(str(report), report.name)


@pytest.mark.parametrize("report", SAMPLE_PATHS, ids=[p.stem for p in SAMPLE_PATHS])
def test_the_window_is_stated_once(report):
    a = sample_analysis(report)
    out = io.StringIO()
    text.render(a, Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("Window: ") for line in lines) == 1
    assert sum(a.window["source"] in line for line in lines) == 1  # not repeated in tables or findings
