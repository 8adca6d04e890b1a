"""What-if runs (``nvtx-trace try``): the program as it is and with knobs applied, timed without a profiler.

The runs are plain timing's (``runner/timing.py``: baseline and variants alternating, each step read back from
the default window); this module judges each variant against the finding whose fix it applies, and writes the
folder.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace.capture import interrupts
from nvtx_trace.errors import UsageError
from nvtx_trace.files import variant_folder
from nvtx_trace.runner import verbs
from nvtx_trace.runner.timing import Variant, compare, first_losses_moved, loss_noise


def advice(program: list[str], python: str | None, out: Path, say) -> tuple[Path, dict, list[dict]]:
    """``try --advice``: the profile (``nvtx-trace run`` into ``out``), its summary, and the knob sets of its top
    findings; UsageError when the profile fails or no finding has a fix a knob applies."""
    from nvtx_trace.errors import UsageError
    from nvtx_trace.runner.diff import load_summary
    from nvtx_trace.runner.profile_child import ProfileFailed, profile

    say(f"--advice: profiling {program[0]} first (nvtx-trace run, outputs in {out})")
    try:
        run = profile(program, python, out, stage="while profiling (--advice)")
    except ProfileFailed as exc:
        raise UsageError(f"--advice: {exc}") from None
    summary = load_summary(run)
    sets = advised(summary.get("findings") or [])
    if not sets:
        raise UsageError(f"{run}: no finding has a fix that a knob applies ({', '.join(declared.names())}); "
                         "nothing to try")
    return run, summary, sets


def measure(program: list[str], sets: list[dict], rounds: int, python: str | None, folder: Path, profile: dict,
            source: str | None, say) -> dict:
    """``try``'s runs: the baseline and each knob set, alternating, plain; what they say (try.json)."""
    say(f"{program[0]}: the baseline and {len(sets)} variant(s), {rounds} round(s) each, alternating; no profiler "
        f"attached, steps timed after warm-up; outputs in {folder}")
    variants = compare(program, sets, rounds, python, progress=say, logs=folder)
    return result(program, rounds, variants, profile, source)


# ---------------------------------------------------------------- what the runs say

CONFIRMED_WITHIN = 0.25  # measured step within 25 % of the predicted one
HELPED = 0.03  # a variant at least 3 % faster than the baseline helped
def knobs_of(finding: dict) -> dict:
    """The knobs that apply the fix the finding predicted (its question says which: questions.knobs_of)."""
    from nvtx_trace.analyzer.questions import knobs_of as question_knobs

    return question_knobs(finding)


def advised(findings: list[dict], top: int = 3) -> list[dict]:
    """The knobs of the top findings (in their rank order) whose fix a knob applies, one set each."""
    sets: list[dict] = []
    for f in findings:
        knobs = declared.for_tune(knobs_of(f))
        if knobs and knobs not in sets:
            sets.append(knobs)
        if len(sets) == top:
            break
    return sets


def own_cost_ns(profile: dict) -> int:
    """What the profile's steps carry that a plain run's do not, as the profile measured it: nvtx_autotrace's
    ranges and, where measured, the profiler's tracing, per step (summary.json ``instrumentation``, ``profiler``)."""
    return sum(int(((profile.get(key) or {}).get("cost_ns_per_step")) or 0) for key in ("instrumentation", "profiler"))


def plain_cost_ns(profile: dict, finding: dict, plain_ms: float) -> int:
    """The tool's own cost per step that a plain pace shows beyond what the profile took out already: the
    profile's step (in the prediction's statistic) less the plain one, less ``own_cost_ns``; never below 0."""
    pred = finding.get("predicted") or {}
    captured = (pred.get("step_ns") or 0) + (pred.get("saving_ns") or 0)
    return int(max(0.0, captured - plain_ms * 1e6 - own_cost_ns(profile))) if captured else 0


def net_saving_ns(finding: dict, profile: dict, plain_ms: float | None = None) -> int:
    """The finding's one prediction, the saving a step (``predicted.saving_ns``, the same number in run, analyze,
    try, tune, diff and the history), less the tool's cost a plain pace showed, for a CPU-bound finding."""
    # the questions' host_kinds: where a plain pace shows the tool cost more than the profile could take out, the
    # rest of that cost is in their saving too, and comes out of it
    from nvtx_trace.analyzer.questions import host_kinds

    saving = int((finding.get("predicted") or {}).get("saving_ns") or 0)
    if plain_ms is None or finding.get("kind") not in host_kinds():
        return saving
    return max(0, saving - plain_cost_ns(profile, finding, plain_ms))


def plain_prediction_ms(finding: dict, profile: dict, plain_ms: float | None = None) -> float | None:
    """A finding's predicted step as a plain run keeps it: the step it comes off less the finding's (net) saving.
    That step is the profile's less the tool's own cost: as a plain pace shows it where one was measured (never
    below 0: a plain baseline slower than the profile keeps a pace of its own, a loader's random work or other
    load, which no fix of the profile's is measured against), else as the profile measured it. Never below the
    loader's pace where that bounds it: the tool's cost slows the training thread, not the loader's workers."""
    pred = finding.get("predicted") or {}
    if pred.get("step_ns") is None:
        return None
    captured = pred["step_ns"] + (pred.get("saving_ns") or 0)
    before = min(captured, plain_ms * 1e6) if plain_ms else captured - own_cost_ns(profile)
    after = before - net_saving_ns(finding, profile, plain_ms) - workers_saving_ns(finding)
    pace = (pred.get("with_workers") or {}).get("loader_pace_ns") or pred.get("loader_pace_ns") or 0
    return max(after, pace, 0) / 1e6


def workers_saving_ns(finding: dict) -> int:
    """Where the loader's pace holds a fix back, its knobs bring the workers that keep up with it
    (``predicted.with_workers``, questions.knobs_of): what those save beyond the fix's own saving."""
    pred = finding.get("predicted") or {}
    more = pred.get("with_workers")
    return max(0, int(pred["step_ns"] - more["step_ns"])) if more and pred.get("step_ns") is not None else 0


def row(v: Variant, base: Variant, profile: dict, noise: float | None = None) -> dict:
    """One variant as the documented JSON (docs/try.md): measured, predicted, verdict. Baseline and variant are
    compared in one statistic, the mean where either's steps are uneven (as diff does). A prediction is the
    finding's predicted saving off the profile's step less the tool's own cost, as the plain baseline shows that
    cost (``plain_prediction_ms``)."""
    findings = profile.get("findings") or []
    stat = "mean" if "mean" in (v.statistic, base.statistic) else "median"
    measured, before = v.value(stat), base.value(stat)
    out = {"knobs": v.knobs, "label": v.label, "statistic": stat, "rounds_ms": v.per_round(stat),
           "measured_step_ms": measured, "baseline_step_ms": before,
           "median_step_ms": v.value("median"), "mean_step_ms": v.value("mean"),
           "speedup": before / measured if measured and before and v.knobs else None,
           "changed": sorted({ln for r in v.rounds for ln in r.lines()}),
           "unapplied": v.unapplied,
           "numerics": declared.numerics(v.knobs),
           "failures": [r.why for r in v.rounds if r.value_ms is None],
           "logs": [str(r.log) for r in v.rounds if r.log],
           "losses": v.rounds[0].losses if v.rounds else [],
           "loss_max_rel_diff": first_losses_moved(base, v) if v.knobs else None,
           "loss_noise_rel": noise,
           "compiled_steps_left_out": [len(r.compiled_ms) for r in v.rounds],
           "compiled_ms_left_out": [round(sum(r.compiled_ms), 3) for r in v.rounds]}
    match = next((f for f in findings if v.knobs and knobs_of(f) == v.knobs), None)  # its fix, no more, no less
    out["finding"] = match.get("kind") if match else None
    pred = (match or {}).get("predicted")
    out["predicted_step_ms"], out["verdict"] = None, None
    out["predicted_saving_ms"] = pred["saving_ns"] / 1e6 if pred and pred.get("saving_ns") is not None else None
    out["tool_cost_ms"] = None
    if pred and pred.get("step_ns") is not None and before and measured and not v.inert:
        stat_p = pred.get("statistic") or stat  # judged in the statistic the prediction is in
        got, base_p = v.value(stat_p) or measured, base.value(stat_p) or before
        out["predicted_step_ms"] = predicted = plain_prediction_ms(match, profile, base_p)
        out["tool_cost_ms"] = (pred["saving_ns"] - net_saving_ns(match, profile, base_p)) / 1e6
        helped = got <= (1 - HELPED) * base_p
        promised = predicted <= (1 - HELPED) * base_p  # a saving worth measuring was predicted
        close = abs(got - predicted) <= CONFIRMED_WITHIN * got
        out["verdict"] = ("confirmed" if close and (helped or not promised) else "partly" if helped
                          else "not confirmed")
    return out


def result(program: list[str], rounds: int, variants: list[Variant], profile: dict,
           source: str | None) -> dict:
    """What ``try`` found, as try.json (docs/json-schema.md, "try"); ``profile``: the summary.json whose
    findings gave the predictions ({} without one)."""
    noise = loss_noise(variants[0])
    own = own_cost_ns(profile)
    rows = [row(v, variants[0], profile, noise) for v in variants]
    captured = ((profile.get("steps") or {}).get("summary") or {}).get(f"step_ns_{rows[0]['statistic']}")
    return {"program": program, "rounds": rounds, "profile": source,
            "profile_step_ms": (captured - own) / 1e6 if captured else None, "variants": rows}


def summary_of(r: dict, folder: Path) -> dict:
    """One variant in the shape of summary.json, as far as ``nvtx-trace diff`` and the history read it: its
    plain steady step, no findings (nothing was profiled), and the prediction it was measured against."""
    from nvtx_trace import __version__
    from nvtx_trace.analyzer.summary import SCHEMA_VERSION

    def ns(x):
        return int(round(x * 1e6)) if x else None

    return {"schema_version": SCHEMA_VERSION, "tool": {"name": "nvtx-trace", "version": __version__},
            "report": {"path": str(folder)},
            "steps": {"source": "nvtx-trace try (no profiler)",
                      "summary": {"step_ns_median": ns(r["median_step_ms"]), "step_ns_mean": ns(r["mean_step_ms"]),
                                  "statistic": r["statistic"], "gpu_busy_fraction": None, "modes": None}},
            "findings": [],
            "try": {k: r[k] for k in ("knobs", "label", "baseline_step_ms", "measured_step_ms", "speedup",
                                      "finding", "predicted_step_ms", "predicted_saving_ms", "verdict",
                                      "unapplied")}}


# ---------------------------------------------------------------- the whole of `nvtx-trace try`

TRY = verbs.Verb("try", "try.json", "try.html", first="baseline", done="tried")


@dataclass
class TryRequest:
    """What the user asked `try` for (cli/try_cmd.py parses it): the program, the knobs and the options."""

    program: list[str]
    knobs: dict
    rounds: int = 2
    each: bool = False
    from_run: Path | None = None
    out: Path | None = None
    json_out: Path | None = None
    force: bool = False
    python: str | None = None
    advice: bool = False
    history_path: Path | None = None
    no_history: bool = False


def run_try(req: TryRequest) -> None:
    """The whole of `nvtx-trace try`: every output checked before anything runs, then the runs and what they say."""
    import time

    from nvtx_trace.files import file_digest
    from nvtx_trace.runner.plan import run_name

    began = time.time()
    declared.check()
    program, from_run, json_out = req.program, req.from_run, req.json_out
    if req.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if req.advice and (req.knobs or from_run):
        raise UsageError("--advice takes its knobs from the profile it runs: give neither knobs nor --from with it")
    script_hash = file_digest(Path(program[0]))
    folder = TRY.folder(req.out, req.force, lambda: f"{run_name(program, 'script')}-try", began)
    inputs = [Path(program[0]), *([from_run] if from_run else [])]
    _check_apart(folder, from_run)
    history_db = TRY.check_outputs(folder, json_out, inputs, req.force, req.history_path, req.no_history)
    profile = _summary(from_run) if from_run else {}  # a bad --from is refused before anything runs
    made = verbs.make(folder)
    try:
        _measure(req, folder, profile, script_hash, history_db, began)
    except interrupts.Interrupted as exc:  # the guard ended the timed program (and its workers) already
        kept = verbs.drop_if_empty(folder, made)
        exc.kept = exc.kept or (f"no variant was measured to the end; the output of the runs so far is kept in "
                                f"{folder}" if kept else "nothing was measured")
        raise


def _measure(req: TryRequest, folder: Path, profile: dict, script_hash: str, history_db, began: float) -> None:
    """The runs, then try.json, try.html, one summary.json per variant and the history rows."""
    program, from_run = req.program, req.from_run

    from nvtx_trace.files import make_folder, write_atomically
    from nvtx_trace.report import try_render
    from nvtx_trace.report.console import console
    from nvtx_trace.runner import history

    say = TRY.say
    TRY.say_tmp_warning()
    if req.advice:
        from_run, profile, sets = advice(program, req.python, folder / "profile", say)
    else:
        sets = [{k: v} for k, v in req.knobs.items()] if req.each else [req.knobs]
    result = measure(program, sets, req.rounds, req.python, folder, profile, str(from_run) if from_run else None, say)
    try_render.text(result, console(highlight=False))
    for r in result["variants"]:  # the folder whole before the --json copy outside it (review)
        sub = folder / variant_folder(r["label"])
        make_folder(sub)
        write_atomically(sub / "summary.json", json.dumps(summary_of(r, sub), indent=2) + "\n")
    written = TRY.write(folder, result, try_render.html(result), req.json_out)
    TRY.said_after_writing(written, Path(program[0]), script_hash, folder,
                           lambda: history.after_try(result, program, folder, history_db, began))
    if len(result["variants"]) > 1:
        first = variant_folder(result["variants"][1]["label"])
        print(f"Next: nvtx-trace diff {folder / 'baseline'} {folder / first}", file=sys.stderr)


def _check_apart(folder: Path, from_run: Path | None) -> None:
    """The try folder is written whole (try.json, try.html, a folder per variant): the --from run it reads
    must not lie in it, and it must not lie in the --from folder."""
    from nvtx_trace.files import inside, same_file, same_path

    if from_run is not None:
        if same_file(from_run, folder) or same_path(from_run, folder) or inside(from_run, folder):
            raise UsageError(f"--from {from_run} is inside the --out folder {folder}, which this try writes; "
                             "choose another --out")
        if inside(folder, from_run):
            raise UsageError(f"--out {folder} is inside --from {from_run}, a folder given as input; "
                             "choose another --out")


def _summary(path: Path) -> dict:
    from nvtx_trace.runner.diff import load_summary

    return load_summary(path)
