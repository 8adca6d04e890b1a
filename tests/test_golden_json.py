"""Every sample report's summary.json, against the one recorded in tests/golden: a refactor changes no figure.

When a change is *meant* to change figures, regenerate and review the diff:

    python tests/test_golden_json.py --update && git diff tests/golden
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
SAMPLES = sorted((ROOT / "sample_reports").glob("*.sqlite"))


def summary(report: Path) -> dict:
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.report.json import to_dict

    out = json.loads(json.dumps(to_dict(analyze(report))))
    out["report"]["path"] = report.name  # where the checkout lives is not a figure
    out["tool"]["version"] = None
    return out


def differences(got, want, where: str = "") -> list[str]:
    """Paths where two JSON values differ; floats compare to 1e-9 relative (summation order may vary)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}.{k}: missing" for k in want if k not in got]
        out += [f"{where}.{k}: new" for k in got if k not in want]
        for k in want.keys() & got.keys():
            out += differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, recorded {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9,
                                                                                             abs_tol=1e-12):
            return []
    elif got == want:
        return []
    return [f"{where}: {got!r}, recorded {want!r}"]


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_sample_summary_matches_the_recorded_one(report):
    want = json.loads((GOLDEN / f"{report.stem}.json").read_text())
    diff = differences(summary(report), want)
    assert not diff, f"{len(diff)} difference(s), first: " + "; ".join(diff[:8])


def test_every_sample_has_a_recorded_summary():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == [p.stem for p in SAMPLES]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_golden_json.py --update")
    for report in SAMPLES:
        (GOLDEN / f"{report.stem}.json").write_text(json.dumps(summary(report), indent=1, sort_keys=True) + "\n")
        print(f"wrote tests/golden/{report.stem}.json")
