"""Summaries of the sample reports and their differences from the recorded ones (tests/golden_questions, put
together by tests/question_snapshots.py).

No pytest here: tests/test_min_versions.py runs this under the declared minimum versions, in a
virtual environment that has nothing else.

    python tests/golden_compare.py            # print the differences of every sample, exit 1 if any
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_reports").glob("*.sqlite"))


def summary(report: Path, analysis=None) -> dict:
    """``analysis``: the report's analysis when the caller has it already (the tests share them)."""
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.analyzer.summary import to_dict

    out = json.loads(json.dumps(to_dict(analysis if analysis is not None else analyze(report))))
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


def check_all() -> int:
    from question_snapshots import recorded_summary

    bad = 0
    for report in SAMPLES:
        diff = differences(summary(report), recorded_summary(report.stem))
        bad += bool(diff)
        print(f"{report.stem}: {len(diff)} difference(s)" + (": " + "; ".join(diff[:5]) if diff else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(check_all())
