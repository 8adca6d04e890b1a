"""What-if runs (``nvtx-trace try``): the program as it is and with knobs applied, timed without a profiler.

Each run is ``python -m nvtx_autotrace SCRIPT ARGS`` with no profiler attached, so nvtx_autotrace keeps only
its step counter (a few µs a step) and the knobs; the default window (auto_window, mode ``time``) skips the
warm-up until the pace settles, times the steps that follow at the step boundaries the counter already
marks (no sync added), and stops the program. Baseline and variants alternate (A B B A ...) so drift on a
shared machine falls on both. A step time is the median of a round's steps, or the mean when they are
uneven (the rule ``diff`` uses); a variant's step is the median of its rounds.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace import names
from nvtx_trace.analyzer.measures.step_times import typical_statistic
from nvtx_trace.capture import interrupts, lifeline, processes
from nvtx_trace.errors import NvtxTraceError, UsageError
from nvtx_trace.files import variant_folder
from nvtx_trace.report.sections import printable
from nvtx_trace.runner import default_window

RUN_TIMEOUT_S = 900  # one run: start-up and compilation, warm-up (at most 30 s once steps run), the window
LOSSES = 5  # steps whose loss is compared with the baseline's (warm-up steps: read once, before any timed step)


@dataclass
class Round:
    step_ms: list[float]  # the timed window's steps
    statistic: str  # median or mean (uneven steps)
    value_ms: float | None
    changes: list[dict]  # what the knobs said they changed: the program's records ({knobs, applied, line})
    returncode: int
    why: str = ""  # why there is no value
    losses: list[float | None] = field(default_factory=list)  # the first steps' losses (LOSSES steps)
    log: Path | None = None  # the run's stderr, kept
    compiled_ms: list[float] = field(default_factory=list)  # steps left out: torch.compile made a graph in them
    parts: dict = field(default_factory=dict)  # where the run's wall time went (run_parts)

    def unapplied(self, knobs: dict) -> list[str]:
        """The knobs that changed nothing in this run: refused (a record with ``applied`` false), or never reached
        (no record names them: no DataLoader built, empty_cache never called, no step 1)."""
        done = {k for c in self.changes if c.get("applied") for k in (c.get("knobs") or {})}
        return [k for k in knobs if k not in done]

    def lines(self, knobs: dict | None = None) -> list[str]:
        """The records' lines, as the program printed them; those naming one of ``knobs`` where given."""
        return [c.get("line") or "" for c in self.changes if knobs is None or set(c.get("knobs") or ()) & set(knobs)]


@dataclass
class Variant:
    knobs: dict  # every knob nvtx_autotrace applies in the run
    rounds: list[Round] = field(default_factory=list)
    added: dict | None = None  # the knobs tried on top of the baseline's (tune); None: all of ``knobs``
    program: list[str] | None = None  # its own command line (tune: the program's options set), else the target's
    via_options: dict = field(default_factory=dict)  # knobs the program's own options apply: knob -> its words

    @property
    def label(self) -> str:
        said = [" ".join(w) for w in self.via_options.values()]
        return ",".join(filter(None, [declared.text(self.knobs), *said])) or "baseline"

    @property
    def trial(self) -> dict:
        """The knobs this variant is about: those it adds to the baseline's."""
        return self.knobs if self.added is None else self.added

    def per_round(self, statistic: str) -> list[float | None]:
        """Each round's step in one statistic (median or mean of its steps); None for a round without steps."""
        pick = statistics.median if statistic == "median" else statistics.fmean
        return [pick(r.step_ms) if r.step_ms else None for r in self.rounds]

    def value(self, statistic: str) -> float | None:
        values = [v for v in self.per_round(statistic) if v is not None]
        return statistics.median(values) if values else None

    @property
    def statistic(self) -> str:
        """Mean when the steps are uneven (the rule diff uses), judged on the median of the rounds."""
        median, mean = self.value("median"), self.value("mean")
        return typical_statistic(median or 0, mean or 0, None) if median else "median"

    @property
    def step_ms(self) -> float | None:
        return self.value(self.statistic)

    @property
    def unapplied(self) -> list[str]:
        """Knobs that changed nothing, judged on the first round that timed its steps (a round that crashed or
        was stopped before step 1 says nothing about the knobs)."""
        ran = next((r for r in self.rounds if r.value_ms is not None), None)
        mine = {k: v for k, v in self.trial.items() if k not in self.via_options}  # an option is no knob record
        return ran.unapplied(mine) if ran is not None and mine else []

    @property
    def inert(self) -> bool:
        """Every knob tried changed nothing: the variant is the baseline's program."""
        return bool(self.trial) and set(self.unapplied) == set(self.trial)

    def changed(self) -> list[str]:
        """What its trial changed: the knobs' records' lines and the options set on its command line."""
        options = [f"{' '.join(w)}: the program's own option ({k})" for k, w in self.via_options.items()
                   if k in self.trial]
        return sorted({ln for r in self.rounds for ln in r.lines(self.trial)} | set(options))


def time_once(target: list[str], knobs: dict, python: str | None = None, cwd: Path | None = None,
              timeout: float | None = None, log: Path | None = None) -> Round:
    """One run of the program, timed in the default window, with ``knobs`` applied; its stderr kept in ``log``."""
    with tempfile.TemporaryDirectory(prefix="nvtx-trace-try-") as tmp:
        window = Path(tmp) / "window.jsonl"
        env = dict(os.environ)
        for key in (names.CAPTURE_ENV, names.TRY_ENV):
            env.pop(key, None)
        env.update({names.AUTO_WINDOW_ENV: "time:exit", names.WINDOW_FILE_ENV: str(window),
                    names.AUTOTRACE_ENV: "auto", names.LOSSES_ENV: str(LOSSES), "PYTHONUNBUFFERED": "1"})
        _private_tmp(env, tmp)
        if knobs:
            env[names.TRY_ENV] = declared.to_json(knobs)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = command(target, python)
        log = log or Path(tmp) / "stderr.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        began, began_at = time.monotonic(), time.time()
        with open(log, "w", encoding="utf-8", errors="replace") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, **processes.OWN_GROUP)  # a worker forked as it is ended dies with it
            line = lifeline.tie(proc, [tmp])  # a SIGKILL of ours takes the program, its workers, this folder
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                interrupts.send([*processes.descendants(proc.pid), proc.pid], signal.SIGKILL)
                proc.wait()
                return Round([], "median", None, [], -1, f"the run was stopped after {timeout:.0f} s (the default "
                                                         "window takes at most about two minutes after start-up)",
                             log=log)
            finally:
                if proc.returncode is not None:
                    leftover = processes.group_members(proc.pid)  # its workers, where it left without them
                    if leftover:
                        interrupts.send(leftover, signal.SIGKILL)
                    line.release()
        wall = time.monotonic() - began
        stderr = log.read_text(encoding="utf-8", errors="replace")
        events = default_window.events(window)
        kept = log if log.parent != Path(tmp) else None
    events = _lead_rank(events)
    changes = [e for e in events if e.get("event") == "knob"]
    closed = next((e for e in reversed(events) if e.get("step_ms")), {})
    steps, compiled = closed.get("step_ms"), set(closed.get("compiled") or ())
    compiled_ms = [t for i, t in enumerate(steps or ()) if i in compiled]
    if compiled and len(compiled) < len(steps):  # a compilation is paid once: it is no step's pace
        steps = [t for i, t in enumerate(steps) if i not in compiled]
    else:
        compiled_ms = []
    losses = next((e.get("values") or [] for e in events if e.get("event") == "losses"), [])
    if not steps:
        said = {f"nvtx-trace try: {c.get('line')}" for c in changes}
        tail = [ln for ln in stderr.strip().splitlines() if ln not in said][-1:] or [""]
        why = ("the program ended before its pace settled" if proc.returncode == 0 else
               f"the program exited with status {proc.returncode}: {tail[0][:200]}")
        return Round([], "median", None, changes, proc.returncode, why + (f" (its output: {kept})" if kept else ""),
                     losses, kept)
    median, mean = statistics.median(steps), statistics.fmean(steps)
    stat = typical_statistic(median, mean, None)
    return Round(steps, stat, median if stat == "median" else mean, changes, proc.returncode, "", losses, kept,
                 compiled_ms, run_parts(events, wall, began_at))


def run_parts(events: list[dict], wall_s: float, began_at: float) -> dict:
    """Where a timed run's wall time went, in seconds, from the window's own notes and the wall clock the run
    began at: ``start_s`` until its first step ended (the interpreter, imports, building the model and data, the
    first step's compilation), ``warmup_s`` until the pace settled, ``window_s`` timed (until the window closed,
    or the program ended), ``end_s`` its exit after that; {} where no window opened."""
    opened = next((e for e in events if e.get("event") == "opened"), {})
    closed = next((e for e in events if e.get("event") == "closed"), None) or next(  # else the program ended first
        (e for e in events if e.get("event") == "ended" and e.get("step_ms")), {})
    first, at_open, at_close = opened.get("first_step_s"), opened.get("at_s"), closed.get("at_s")
    if first is None or at_open is None or at_close is None:
        return {}
    before = max(0.0, (opened.get("installed_at") or began_at) - began_at)  # until nvtx_autotrace was imported
    return {"wall_s": round(wall_s, 2), "start_s": round(before + first, 2), "warmup_s": round(at_open - first, 2),
            "window_s": round(at_close - at_open, 2), "end_s": round(max(0.0, wall_s - before - at_close), 2)}


SOCKET_MAX, SOCKET_TAIL = 107, 40  # a Unix socket path's limit; what multiprocessing adds (/pymp-x/listener-x)


def _private_tmp(env: dict, tmp: str) -> None:
    """The timed program's temporary files go to our folder, removed after the run: it leaves as its window closes
    (auto_window), and its DataLoader workers' multiprocessing folders (pymp-*, one a worker) stayed behind in the
    user's. Inductor's compile cache stays where it was (its default is under the temporary folder): warm across
    the runs of one tune, as without the tool. Not where the folder's path is long: multiprocessing's sockets live in
    it (``pymp-*/listener-*``), and a Unix socket's path has 107 bytes at most (the workers failed to start)."""
    if len(os.fsencode(tmp)) + SOCKET_TAIL > SOCKET_MAX:
        return
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        import getpass
        import re

        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid: Inductor falls back the same way
            user = str(os.getuid())
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                      "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    env["TMPDIR"] = tmp


def command(target: list[str], python: str | None = None) -> list[str]:
    """The plain run: ``python -m nvtx_autotrace SCRIPT ARGS``; a torchrun job starts that in each rank
    (``torchrun [its options] --no-python python -u -m nvtx_autotrace SCRIPT ARGS``)."""
    from nvtx_trace.capture import torchrun

    launch = torchrun.parse(target)
    if launch is not None and launch.program and launch.kind != "command":
        return [*launch.launcher, "--no-python", *launch.rank_argv(python)]
    return [python or sys.executable, "-m", "nvtx_autotrace", *target]


def _lead_rank(events: list[dict]) -> list[dict]:
    """Rank 0's decisions (every rank of a torchrun job appends to one window file; they step together, each
    stopping after the same fixed count): one rank's steps and losses, not the ranks' interleaved."""
    ranks = {e.get("rank") for e in events}
    if len(ranks) < 2:
        return events
    lead = "0" if "0" in ranks else sorted(r for r in ranks if r is not None)[0]
    return [e for e in events if e.get("rank") == lead]


def loss_difference(base: list, other: list) -> float | None:
    """The largest relative difference between two runs' losses over the steps both recorded."""
    pairs = [(a, b) for a, b in zip(base, other) if a is not None and b is not None and a == a and b == b]
    if not pairs:
        return None
    return max(abs(b - a) / max(abs(a), 1e-12) for a, b in pairs)


def loss_noise(base: Variant) -> float | None:
    """How far the baseline's own losses move between its rounds: below this, a difference is noise."""
    runs = [r.losses for r in base.rounds if r.losses]
    diffs = [d for other in runs[1:] if (d := loss_difference(runs[0], other)) is not None]
    return max(diffs) if diffs else None


def compare(target: list[str], knob_sets: list[dict], rounds: int = 2, python: str | None = None,
            progress=None, logs: Path | None = None, base: dict | None = None) -> list[Variant]:
    """The baseline and each knob set, ``rounds`` times each, alternating; the baseline first in the list.
    ``base``: knobs the baseline runs with (tune's configuration so far), each knob set applied on top.
    A variant whose knobs changed nothing in its first round is not run again (its timing is the baseline's
    program); each run's stderr goes to ``logs/<variant>/round-N.log``."""
    if base:
        variants = [Variant(dict(base), added={}), *(Variant({**base, **k}, added=dict(k)) for k in knob_sets)]
    else:
        variants = [Variant({}), *(Variant(k) for k in knob_sets)]
    return alternate(target, variants, rounds, python, progress, logs)


def alternate(target: list[str], variants: list[Variant], rounds: int, python: str | None = None, progress=None,
              logs: Path | None = None, settled=None) -> list[Variant]:
    """Each variant ``rounds`` times, alternating (A B B A ...), the first the baseline; each runs its own command
    line where it has one. ``settled(variants)``: a reason to stop before the rounds are done (tune: the verdict
    can no longer change), said through ``progress``."""
    for r in range(rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for v in order:
            if v.inert or len(v.rounds) > r:  # inert, or this round of it was measured already (tune: reused)
                continue
            why = settled(variants) if settled and r else None
            if why:
                if progress:
                    progress(f"round {r + 1}/{rounds}: not run: {why}")
                return variants
            interrupts.stage(f"in round {r + 1}/{rounds} ({v.label})")
            if progress:
                progress(f"round {r + 1}/{rounds}: {v.label}")
            log = logs / variant_folder(v.label) / f"round-{r + 1}.log" if logs else None
            v.rounds.append(time_once(v.program or target, v.knobs, python, timeout=RUN_TIMEOUT_S, log=log))
            if v is variants[0] and not any(x.step_ms for x in v.rounds):  # no variant runs against nothing
                raise NvtxTraceError(f"the baseline run gave no step times: {v.rounds[-1].why}; nvtx-trace try needs "
                                     "a training loop that calls optimizer.step() (or nvtx_autotrace.mark_step()) "
                                     "for at least ~30 steps")
    return variants


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
           "loss_max_rel_diff": (loss_difference(base.rounds[0].losses, v.rounds[0].losses)
                                 if v.knobs and v.rounds and base.rounds else None),
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
    from nvtx_trace.report.json import SCHEMA_VERSION

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

TRY_JSON, TRY_HTML = "try.json", "try.html"


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
    import shutil
    import time

    from nvtx_trace.files import check_outputs, file_digest, inside, make_folder, same_path
    from nvtx_trace.runner import history

    began = time.time()
    declared.check()
    program, from_run, json_out = req.program, req.from_run, req.json_out
    if req.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if req.advice and (req.knobs or from_run):
        raise UsageError("--advice takes its knobs from the profile it runs: give neither knobs nor --from with it")
    script_hash = file_digest(Path(program[0]))
    folder = _folder(req.out, program, req.force, began)
    inputs = [Path(program[0]), *([from_run] if from_run else [])]
    _check_apart(folder, from_run, json_out)
    if json_out:
        check_outputs([json_out], inputs, req.force)
    history_db = history.resolve_path(req.history_path, disabled=req.no_history)
    history.check(history_db, inputs=inputs,
                  written=lambda p: inside(p, folder) or (json_out is not None and same_path(p, json_out)))
    profile = _summary(from_run) if from_run else {}  # a bad --from is refused before anything runs
    made = not folder.exists()
    make_folder(folder)
    try:
        _measure(req, folder, profile, script_hash, history_db, began)
    except interrupts.Interrupted as exc:  # the guard ended the timed program (and its workers) already
        kept = any(p.is_file() for p in folder.rglob("*"))
        if not kept and made:
            shutil.rmtree(folder, ignore_errors=True)
        exc.kept = exc.kept or (f"no variant was measured to the end; the output of the runs so far is kept in "
                                f"{folder}" if kept else "nothing was measured")
        raise


def _measure(req: TryRequest, folder: Path, profile: dict, script_hash: str, history_db, began: float) -> None:
    """The runs, then try.json, try.html, one summary.json per variant and the history rows."""
    program, from_run, json_out = req.program, req.from_run, req.json_out

    from nvtx_trace.files import make_folder, write_atomically
    from nvtx_trace.report import try_render
    from nvtx_trace.report.console import console
    from nvtx_trace.runner import history

    def say(message: str) -> None:
        print(f"nvtx-trace try: {printable(message)}", file=sys.stderr, flush=True)

    if req.advice:
        from_run, profile, sets = advice(program, req.python, folder / "profile", say)
    else:
        sets = [{k: v} for k, v in req.knobs.items()] if req.each else [req.knobs]
    result = measure(program, sets, req.rounds, req.python, folder, profile, str(from_run) if from_run else None, say)
    try_render.text(result, console(highlight=False))
    text = json.dumps(result, indent=2) + "\n"
    written = [folder / TRY_JSON, folder / TRY_HTML]
    write_atomically(written[0], text)
    write_atomically(written[1], try_render.html(result))
    for r in result["variants"]:
        sub = folder / variant_folder(r["label"])
        make_folder(sub)
        write_atomically(sub / "summary.json", json.dumps(summary_of(r, sub), indent=2) + "\n")
    if json_out:
        write_atomically(json_out, text)
        written.append(json_out)
    said_after_writing(say, written, Path(program[0]), script_hash, "tried", folder,
                       lambda: history.after_try(result, program, folder, history_db, began))
    if len(result["variants"]) > 1:
        first = variant_folder(result["variants"][1]["label"])
        print(f"Next: nvtx-trace diff {folder / 'baseline'} {folder / first}", file=sys.stderr)




def said_after_writing(say, written: list[Path], script: Path | None, digest: str | None, verb: str, folder: Path,
                       record) -> None:
    """What `try` and `tune` say once their outputs are written: the script changed meanwhile (never by us: the
    knobs touch no file of the user's), each file written, and the history's warning (``record()`` adds the
    rows)."""
    from nvtx_trace.files import file_digest

    if script is not None and file_digest(script) != digest:
        say(f"warning: {script} changed while it was {verb} (not by nvtx-trace: it writes only to {folder})")
    for path in written:
        print(f"Wrote {printable(path)}", file=sys.stderr)
    warning = record()
    if warning:
        say(f"warning: {warning}")


def _folder(out: Path | None, program: list[str], force: bool, now: float) -> Path:
    """The outputs' folder, checked before anything runs: --out, or a fresh one under ./nvtx-trace-out."""
    from nvtx_trace.runner.plan import DEFAULT_OUT_ROOT, fresh_folder, given_folder, run_name

    if out is not None:
        given_folder(out)
        taken = [name for name in (TRY_JSON, TRY_HTML, "baseline") if (out / name).exists()]
        if taken and not force:
            raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
        return out.resolve()
    return fresh_folder(Path(DEFAULT_OUT_ROOT), f"{run_name(program, 'script')}-try", now)


def _check_apart(folder: Path, from_run: Path | None, json_out: Path | None) -> None:
    """The try folder is written whole (try.json, try.html, a folder per variant): the --from run it reads
    must not lie in it, it must not lie in the --from folder, and --json must not be one of its files."""
    from nvtx_trace.files import inside, same_file, same_path

    if from_run is not None:
        if same_file(from_run, folder) or same_path(from_run, folder) or inside(from_run, folder):
            raise UsageError(f"--from {from_run} is inside the --out folder {folder}, which this try writes; "
                             "choose another --out")
        if inside(folder, from_run):
            raise UsageError(f"--out {folder} is inside --from {from_run}, a folder given as input; "
                             "choose another --out")
    if json_out is not None and inside(json_out, folder):
        raise UsageError(f"--json {json_out} is inside the try folder {folder}, which gets {TRY_JSON} itself; "
                         "give --json a path outside it")


def _summary(path: Path) -> dict:
    from nvtx_trace.runner.diff import load_summary

    return load_summary(path)
