"""Every sample report's outputs, question by question, against their snapshots (tests/golden_questions, made by
tests/question_snapshots.py): each question's summary.json keys, the findings it raised, its terminal lines and
its HTML part; the frame (the summary's head and tail, the terminal's header and notes, the rest of the page)
apart. A refactor changes none of them; a new question adds its own file.

When a change is *meant* to change outputs, regenerate and review the diff:

    python tests/question_snapshots.py --update && git diff tests/golden_questions
"""

from __future__ import annotations

import json

import pytest
from conftest import sample_analysis
from golden_compare import differences
from question_snapshots import FRAME, SAMPLES, SNAPSHOTS, parts_of, recorded, recorded_summary, recorded_text

from nvtx_trace.analyzer.questions import REGISTRY


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_each_question_s_part_matches_its_snapshot(report):
    got, want = parts_of(report, sample_analysis(report)), recorded(report.stem)
    diff = [d for name in sorted(set(got) | set(want)) for d in differences(got.get(name, {}), want.get(name, {}),
                                                                            name)]
    assert not diff, f"{len(diff)} difference(s), first: " + "; ".join(diff[:8])


@pytest.mark.parametrize("report", SAMPLES[:3], ids=[p.stem for p in SAMPLES[:3]])
def test_the_parts_put_together_are_the_whole_outputs(report):
    """The snapshots are the outputs themselves: the summary and the terminal report, put together from them."""
    from golden_compare import summary
    from test_sections import text_of

    a = sample_analysis(report)
    assert not differences(summary(report, a), recorded_summary(report.stem))
    assert text_of(report) == recorded_text(report.stem)


def test_every_question_has_its_snapshot_of_every_sample():
    assert sorted(f.stem for f in SNAPSHOTS.glob("*.json")) == sorted([q.name for q in REGISTRY] + [FRAME])
    for f in SNAPSHOTS.glob("*.json"):
        assert sorted(json.loads(f.read_text())) == [p.stem for p in SAMPLES], f.name
