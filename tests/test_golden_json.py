"""Every sample report's summary.json, against the one recorded in tests/golden: a refactor changes no figure.

When a change is *meant* to change figures, regenerate and review the diff:

    python tests/test_golden_json.py --update && git diff tests/golden
"""

from __future__ import annotations

import json
import sys

import pytest
from conftest import sample_analysis
from golden_compare import GOLDEN, SAMPLES, differences, summary


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_summary_matches_the_recorded_one(report):
    want = json.loads((GOLDEN / f"{report.stem}.json").read_text())
    diff = differences(summary(report, sample_analysis(report)), want)
    assert not diff, f"{len(diff)} difference(s), first: " + "; ".join(diff[:8])


def test_every_sample_has_a_recorded_summary():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == [p.stem for p in SAMPLES]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_golden_json.py --update")
    for report in SAMPLES:
        (GOLDEN / f"{report.stem}.json").write_text(json.dumps(summary(report), indent=1, sort_keys=True) + "\n")
        print(f"wrote tests/golden/{report.stem}.json")
