"""One prediction per finding (issue 41): ``predicted.saving_ns`` is the number ``run`` and ``analyze`` print,
``try`` and ``tune`` take off the plain step, ``diff`` compares and the history keeps, on every shipped sample.

The analyzer's output is each sample's recorded summary and terminal text (tests/golden_questions: their
own tests hold them equal to what ``analyze`` writes today); every other command's number is computed here by its
own code from that summary and compared with the finding's."""

from __future__ import annotations

import pytest
from question_snapshots import SAMPLES, recorded_summary, recorded_text

from nvtx_trace.analyzer.questions import host_kinds
from nvtx_trace.runner import history_rows, history_store, timing, try_runs, tune_trial
from nvtx_trace.runner.diff import compare
from nvtx_trace.units import ms


def predicted(summary: dict) -> list[dict]:
    return [f for f in summary["findings"] if (f.get("predicted") or {}).get("saving_ns")]


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_each_command_shows_the_finding_s_one_saving(report, tmp_path):
    summary = recorded_summary(report.stem)
    text = " ".join(recorded_text(report.stem).split())  # as read, whatever the width wrapped
    found = predicted(summary)
    for f in found:
        pred = f["predicted"]
        # run/analyze: "step A -> about B", A - B being the saving
        assert f"{ms(pred['step_ns'] + pred['saving_ns'])} -> about {ms(pred['step_ns'])}" in text, f["kind"]

    # the history, written and read back through a real database
    db = tmp_path / "h.db"
    row = {"started_at": "t", "kind": "run", "script": "s", "mode": "script", "exit_code": 0}
    history_store.record(db, row, history_rows.finding_rows(summary))
    stored = history_store.query(db)[0]["findings"]
    assert [s["predicted_saving_ns"] for s in stored if s["predicted_saving_ns"]] == [
        f["predicted"]["saving_ns"] for f in found]

    # diff: the before-run's findings against an after-run
    rows = {(r["kind"], r["cause"]): r for r in compare(summary, summary)["findings"]}
    compared = 0
    for f in found:  # diff keeps one row per kind and cause: the finding whose step it shows
        r = rows[(f["kind"], (f.get("evidence") or {}).get("cause"))]
        if r.get("predicted_step_ns") == f["predicted"]["step_ns"]:
            assert r["predicted_saving_ns"] == f["predicted"]["saving_ns"]
            compared += 1
    assert compared or not found

    # try and tune: the same saving off the plain baseline (a non-CPU-bound finding: nothing else comes off), and
    # where the loader's pace holds the fix back, what the workers its knobs bring along save beyond it
    for f in found:
        pred = f["predicted"]
        plain = (pred["step_ns"] + pred["saving_ns"]) / 1e6 * 0.9  # a plain pace below the profile's
        stat = pred.get("statistic") or "median"
        base = timing.Variant({}, [timing.Round([plain], stat, plain, [], 0)])
        knobs = try_runs.knobs_of(f)
        if not knobs:
            continue
        said = [{"event": "knob", "knobs": {k: v}, "applied": True, "line": f"{k}={v}: applied"} for k, v in knobs.items()]
        v = timing.Variant(knobs, [timing.Round([plain * 0.8], stat, plain * 0.8, said, 0)])
        r = try_runs.row(v, base, {**summary, "findings": [f]})
        assert r["predicted_saving_ms"] * 1e6 == pytest.approx(pred["saving_ns"])
        net = pred["saving_ns"] - r["tool_cost_ms"] * 1e6
        more = pred.get("with_workers") or {}
        if more:
            assert knobs["num_workers"] == more["workers"] and more["step_ns"] < pred["step_ns"]
        extra = pred["step_ns"] - more["step_ns"] if more else 0
        after = max(plain - (net + extra) / 1e6, (more.get("loader_pace_ns") or pred.get("loader_pace_ns") or 0) / 1e6)
        assert r["predicted_step_ms"] == pytest.approx(after)
        if f["kind"] not in host_kinds():
            assert r["tool_cost_ms"] == 0
        c = next((c for c in tune_trial.candidates({**summary, "findings": [f]}, {}, [], plain)), None)
        if c is not None:
            assert c.predicted_step_ms == pytest.approx(after)
            assert tune_trial.saving_ms(c.finding) == pytest.approx(pred["saving_ns"] / 1e6, abs=1e-3)


def test_every_sample_predicts_something_somewhere():
    """The test above is not vacuous: most samples carry predictions, and some of them a knob applies."""
    with_pred = [p for p in SAMPLES if predicted(recorded_summary(p.stem))]
    assert len(with_pred) >= len(SAMPLES) // 2
    knobbed = sum(1 for p in with_pred for f in predicted(recorded_summary(p.stem))
                  if try_runs.knobs_of(f))
    assert knobbed >= 5


def test_a_plain_pace_takes_the_tool_s_extra_cost_out_of_a_cpu_bound_saving_only():
    """Issue 41: a Lightning program's profile ran 92.1 ms a step and its plain pace 93.65; another's profile 165 ms
    and plain 113 ms. Where the plain pace is shorter than the profile's step less the cost the profile took out
    itself, the rest is the tool's too: a CPU-bound finding's saving loses it (never below 0), a GPU finding's
    does not; a plain pace slower than the profile takes nothing off."""
    profile = {"instrumentation": {"cost_ns_per_step": 2e6}, "profiler": None}
    cpu = {"kind": "cpu_overhead", "predicted": {"step_ns": 135e6, "saving_ns": 30e6}}
    gpu = {"kind": "precision", "predicted": {"step_ns": 135e6, "saving_ns": 30e6}}
    # profile step 165, own 2 measured: plain 113 shows 50 more, the whole saving
    assert try_runs.net_saving_ns(cpu, profile, 113.0) == 0
    assert try_runs.plain_prediction_ms(cpu, profile, 113.0) == pytest.approx(113.0)
    assert try_runs.net_saving_ns(gpu, profile, 113.0) == 30e6
    assert try_runs.plain_prediction_ms(gpu, profile, 113.0) == pytest.approx(83.0)
    # plain 150: 13 ms beyond the profile's own 2
    assert try_runs.net_saving_ns(cpu, profile, 150.0) == 17e6
    # plain slower than the profile: nothing more is the tool's
    assert try_runs.net_saving_ns(cpu, profile, 170.0) == 30e6
    # no plain pace: the profile's own figures, as before
    assert try_runs.plain_prediction_ms(cpu, profile) == pytest.approx(133.0)
    # tune ranks by the net saving: the CPU-bound finding made of the tool's own cost is no candidate
    both = {**profile, "steps": {"summary": {"step_ns_median": 165e6}},
            "findings": [{**cpu, "recommend": {"compile": "reduce-overhead"}}, {**gpu, "recommend": {"tf32": True}}]}
    assert [c.knobs for c in tune_trial.candidates(both, {}, [], 113.0)] == [{"tf32": True}]
    assert [c.knobs for c in tune_trial.candidates(both, {}, [])] == [{"compile": "reduce-overhead"}, {"tf32": True}]
