"""The terminal report states the analysis window once; and each sample report's text equals its reviewed snapshot
(tests/golden_text, read line by line when recorded). When a change is meant to change the text:

    python tests/test_sections.py --update && git diff tests/golden_text
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, sample_analysis
from rich.console import Console

from nvtx_trace.report import text

SAMPLE_PATHS = sorted(SAMPLES.glob("*.sqlite"))
SNAPSHOTS = Path(__file__).parent / "golden_text"


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


@pytest.mark.parametrize("report", SAMPLE_PATHS, ids=[p.stem for p in SAMPLE_PATHS])
def test_text_equals_the_reviewed_snapshot(report):
    assert text_of(report) == (SNAPSHOTS / f"{report.stem}.txt").read_text()


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_sections.py --update")
    SNAPSHOTS.mkdir(exist_ok=True)
    for report in SAMPLE_PATHS:
        (SNAPSHOTS / f"{report.stem}.txt").write_text(text_of(report))
        print(f"wrote tests/golden_text/{report.stem}.txt")
