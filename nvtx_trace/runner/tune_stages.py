"""The stages of ``tune``: one loop that holds their state (the knobs kept and rejected, the budget, each run's time).

Apart from the command around it (``tune.py``: its checks, the folder, the history) so that it runs with stand-in
profiles and runs; ``Tuner.result()`` is tune.json, written after every stage.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace import names
from nvtx_trace.errors import NvtxTraceError, UsageError
from nvtx_trace.report.tune_render import mmss
from nvtx_trace.runner import program_options, timing, try_runs
from nvtx_trace.runner.profile_child import ProfileFailed, profile
from nvtx_trace.runner.tune_trial import (
    MIN_SAVING,
    Candidate,
    candidates,
    judge,
    next_knobs,
    profiled_step_ms,
    remaining,
    saving_ms,
    settled,
)

DEFAULT_BUDGET_S = 600  # measured on H200s: a stage costs 35-100 s, GPT-2 trainer fp32 7.08x in 356 s
TOP_FINDINGS = 5  # findings shown per stage
MIN_STEPS = 3  # fewer in a profile: no loop ends its steps (one range for the whole run is no training step)


@dataclass
class Tuner:
    program: list[str]
    folder: Path
    python: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    rounds: int = 2
    say: object = print  # progress, one line at a time
    clock: object = time.monotonic
    kept: dict = field(default_factory=dict)
    rejected: list = field(default_factory=list)
    stages: list = field(default_factory=list)
    stopped: str | None = None
    failed: bool = False  # it stopped on a failure (a profile, the configuration's runs), not by choice
    final_check: dict | None = None
    last_profile: dict = field(default_factory=dict)
    first_settings: dict = field(default_factory=dict)  # the program as it is: its FLOPs were counted there
    _began: float = 0.0
    _profile_s: float | None = None
    _run_s: float | None = None
    _baseline: float | None = None  # the original program, plain, in the first trial
    _current: float | None = None  # the configuration so far, as last measured
    _chain: float = 1.0  # the kept trials' speed-ups multiplied: each measured in one sitting, in its own statistic
    _profiles: int = 0
    options: list = field(default_factory=list)  # the program's own options (program_options.read)
    levers: dict = field(default_factory=dict)  # knob -> the options that do what it does
    via: dict = field(default_factory=dict)  # kept knobs the program's options apply: knob -> its words
    option_trials: list = field(default_factory=list)  # (knob, value, words, kept) for each option trial
    unusable: dict = field(default_factory=dict)  # knob -> the option words whose trial failed: the knob applies
    spent: dict = field(default_factory=lambda: {"profiles_s": 0.0, "trials_s": 0.0, "final_check_s": 0.0,
                                                 "trials": 0, "runs": 0, "stopped_early": 0})
    _fresh_profile_s: float | None = None
    _trial_s: float | None = None
    _reused: bool = False  # this stage tries a knob on the last stage's profile (_independent)
    _parts: list = field(default_factory=list)  # each plain run's parts (timing.run_parts)
    _last_round: object = None  # the configuration so far's last timed run: the next trial's first baseline round

    def __post_init__(self):
        self.options = program_options.with_current(program_options.read(script_of(self.program)), self.program)
        self.levers = program_options.levers(self.options)

    def left(self) -> float:
        return self.budget_s - (self.clock() - self._began)

    def current_program(self) -> list[str]:
        """The program with the options kept so far set on its command line."""
        return program_options.with_words(self.program, self.options, [w for ws in self.via.values() for w in ws])

    def knob_part(self, knobs: dict) -> dict:
        """The knobs nvtx_autotrace applies: those no kept or tried option applies."""
        return {k: v for k, v in knobs.items() if k not in self.via}

    def reserve_s(self) -> float:
        """Kept once a knob is kept: for the final check (the original against the tuned program, a trial's cost),
        so the speed-up is always measured in one sitting, and for a profile of the tuned program, so what is left
        comes from it."""
        return self.trial_s(rounds=1) + (self._profile_s or 0.0) if self.kept else 0.0

    def clock_text(self) -> str:
        used = self.clock() - self._began
        return f"{mmss(used)} used, {mmss(max(0.0, self.budget_s - used))} left"

    def trial_s(self, rounds: int | None = None) -> float:
        per_run = self._run_s if self._run_s is not None else 0.7 * (self._profile_s or 0)
        return 2 * (rounds or self.rounds) * per_run

    def start_runs(self) -> int:
        """How many plain runs ``start_s`` counts."""
        return 2 * (self.rounds if self._run_s is not None else 1)

    def start_s(self) -> float:
        """What a trial needs left to start: all its rounds once a plain run was timed; before that only its first
        round (the profile's guess at a run is the whole profile's time less 30 %: an H200 tune of a compiled GPT
        refused 200 s for a guessed 43 s a run), each later run then started where the measured ones say it fits."""
        return self.trial_s(rounds=self.start_runs() // 2)

    def run(self, on_stage=None) -> dict:
        """Stages until nothing is left or the budget is spent; ``on_stage(result)`` after each (tune.json
        written as it goes). Interrupted propagates, the result so far is ``self.result()``."""
        self._began = self.clock()
        stale, summary = True, {}
        since: dict = {}  # the knobs kept since the profile in hand
        while True:
            found = self._independent(summary, since) if stale and summary else []
            self._reused = bool(found)
            if found:
                self.say(f"stage {len(self.stages) + 1}: no new profile: {declared.text(since)} changed another part "
                         f"of a step than {declared.text(found[0].knobs)} fixes, so the last profile still holds")
            if stale and not found:
                if self._profiles and self._profile_s + self.start_s() + self.reserve_s() > self.left():
                    self.stopped = "budget"
                    break
                summary = self._profile()
                if summary is None:
                    break
                stale, since = False, {}
            found = found or candidates(summary, self.kept, self.rejected, self._current, self.levers)
            if not found:
                self._stage_row(summary, None, {"kept": False, "why": self._nothing_left(summary)})
                self.stopped = "nothing left"
                break
            c = found[0]
            if self.start_s() + self.reserve_s() > self.left():
                self.stopped = "budget"
                break
            kept, via, failed = self._trial(summary, c)
            if not kept and via and failed:
                # the program refused or crashed on its own option: the knob is tried as nvtx_autotrace applies it
                self.say(f"stage {len(self.stages)}: the program's own option failed; "
                         f"{declared.text(c.knobs)} is tried as a knob instead")
                self.unusable.update(via)
                self.levers = {k: v for k, v in self.levers.items() if k not in via}
                continue
            if kept:
                self.kept.update(c.knobs)
                since.update(c.knobs)
                for k in c.knobs:  # a knob now applied by an option, or by nvtx_autotrace instead of one
                    self.via.pop(k, None)
                self.via.update(via)
                stale = True
            else:
                self.rejected.append(c.knobs)
            if on_stage:
                on_stage(self.result())
        if stale and self.kept and self.stopped == "budget" and self._profile_s is not None and (
                self._profile_s <= self.left() - (self.trial_s(rounds=1) if len(self.kept) > 1 else 0.0)):
            self._profile("final")  # what is left comes from the tuned program, not from before its last knob
        if len([s for s in self.stages if s["kept"]]) > 1:
            self._check_final()
        return self.result()

    def _independent(self, summary: dict, since: dict) -> list[Candidate]:
        """The last profile's candidates that the knobs kept since cannot change (they change another part of a
        step: knobs.interact): tried without profiling again, a profile's time saved a stage."""
        return [c for c in candidates(summary, self.kept, self.rejected, self._current, self.levers)
                if not declared.interact(c.knobs, since)]

    def _profile(self, final: str | None = None) -> dict | None:
        """The program profiled with the configuration so far: a stage's (``stage-N/profile``), or ``final``'s."""
        n = len(self.stages) + 1
        out = self.folder / (final or f"stage-{n}") / "profile"
        what = f" with {self.configuration_text()}" if self.kept else " as it is"
        shown = script_of(self.program) or " ".join(self.program[:2])
        said = f"{final}: what is left in the tuned program:" if final else f"stage {n}:"
        self.say(f"{said} profiling {shown}{what} (nvtx-trace run; {self.clock_text()})")
        t0 = self.clock()
        try:
            profile(self.current_program(), self.python, out, self.knob_part(self.kept),
                    stage=f"while profiling ({final or f'stage {n}'})",
                    log=out.parent / "profile.log", env={} if self._profiles else {names.FLOPS_ENV: "1"})
        except ProfileFailed as exc:
            if not self._profiles and exc.program_ran_clean:  # it ran to its end, and left nothing to analyze
                raise UsageError(f"{script_of(self.program) or self.program[0]}: the profile found no training "
                                 "steps (nothing called optimizer.step() or nvtx_autotrace.mark_step()): tune needs a "
                                 f"training loop of at least ~30 steps ({exc})") from None
            if not self._profiles:
                raise UsageError(f"{script_of(self.program) or self.program[0]}: {exc}") from None
            if not final:  # a failed final profile leaves what is left as the last stage's profile said
                self.stopped, self.failed = f"profile failed: {exc}", True
            return None
        self._profile_s = self.clock() - t0
        self._fresh_profile_s = self._profile_s  # the next stage row's: it profiled anew
        self.spent["profiles_s"] += self._profile_s
        self._profiles += 1
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        if (((summary.get("steps") or {}).get("summary") or {}).get("steps") or 0) < MIN_STEPS:
            if self._profiles == 1:
                raise UsageError(f"{script_of(self.program) or self.program[0]}: the profile found no training "
                                 "steps (nothing called optimizer.step() or nvtx_autotrace.mark_step()): tune needs a "
                                 f"training loop of at least ~30 steps; the profile is in {out}")
            if not final:
                self.stopped, self.failed = "the profile found no training steps", True
            return None
        self.last_profile = {"path": str(out), "summary": summary, "configuration": dict(self.kept)}
        if self._profiles == 1:
            self.first_settings = summary.get("settings") or {}
        return summary

    def _no_time_for_a_run(self, final: bool = False, variants=()) -> str | None:
        """The budget is a ceiling: a trial's next run is not started where it would leave too little for the final
        check (judge then decides on the rounds run). One round of the final check is reserved; its later rounds
        run where the budget still holds them. The slowest run yet sets the pace, this trial's own included."""
        walls = [r.parts["wall_s"] for v in variants for r in v.rounds if r.parts and r.parts.get("wall_s")]
        if self._run_s is None and not walls:
            return None
        run_s = max([self._run_s or 0.0, *walls])
        if self.left() - (0.0 if final else self.reserve_s()) < run_s:
            return f"another run would pass the --budget of {self.budget_s:.0f} s"
        return None

    def configuration_text(self, knobs: dict | None = None, via: dict | None = None) -> str:
        """``num_workers=8 (--workers 8),tf32=1``: each knob, with the program's own words where an option sets it."""
        knobs = self.kept if knobs is None else knobs
        via = self.via if via is None else via
        return ",".join(declared.text({k: v}) + (f" ({' '.join(via[k])})" if k in via else "")
                        for k, v in knobs.items())

    def _trial(self, summary: dict, c: Candidate) -> tuple[bool, dict, bool]:
        """The candidate timed plain against the configuration so far: through the program's own options where it
        has them (what the user keeps), else by nvtx_autotrace; (kept, the options it set: knob -> words, whether a
        run with it failed)."""
        n = len(self.stages) + 1
        via = {k: w for k, v in c.knobs.items() if (w := program_options.words_for(self.levers, k, v))}
        c.via = via
        label = self.configuration_text(c.knobs, via)
        guess = (f"predicted {c.profile_step_ms:.2f} -> {c.predicted_step_ms:.2f} ms" if c.predicted_step_ms is not None
                 else "no prediction: measured")
        self.say(f"stage {n}: trying {label} ({c.finding.get('kind')}: {guess}) against "
                 f"{self.configuration_text() or 'the program as it is'}, "
                 f"{self.rounds} round(s) each, plain ({self.clock_text()})")
        current = self.current_program()
        kept_knobs = self.knob_part(self.kept)
        added = {k: v for k, v in c.knobs.items() if k not in via}
        kept_via = {k: w for k, w in self.via.items() if k not in c.knobs}
        tried = program_options.with_words(current, self.options, [w for ws in via.values() for w in ws])
        # the configuration so far was timed in the last trial: that run is this trial's first baseline round (A B,
        # then B A), a run saved; a first round 15 % faster then needs no second
        reused = [self._last_round] if self._last_round is not None else []
        variants = [timing.Variant(kept_knobs, rounds=list(reused), added={}, program=current,
                                     via_options=dict(self.via)),
                    timing.Variant({**{k: v for k, v in kept_knobs.items() if k not in via}, **added},
                                     added=dict(c.knobs), program=tried, via_options={**kept_via, **via})]
        paced = {s: profiled_step_ms(summary, s) for s in ("median", "mean")}  # the baseline, as profiled
        t0 = self.clock()
        try:
            base, v = timing.alternate(current, variants, self.rounds, self.python,
                                         progress=lambda m: self.say(f"stage {n}: {m}"),
                                         logs=self.folder / f"stage-{n}",
                                         settled=lambda vs: settled(vs, paced) or self._no_time_for_a_run(variants=vs))
        except NvtxTraceError:
            if self._baseline is None:
                raise
            self.stopped, self.failed = "the configuration so far stopped giving step times", True
            return False, via, False
        timed = base.rounds[len(reused):] + v.rounds  # the runs this trial made
        runs = len(timed)
        self._parts += [r.parts for r in timed if r.parts]
        self._trial_s = self.clock() - t0
        # the slowest run yet: the budget is a ceiling, and the final check's runs (the original program, the tuned
        # one compiling) are no shorter than a trial's (an H200 run went 4.5 s past 430 s on the mean)
        self._run_s = max([self._run_s or 0.0, self._trial_s / max(1, runs),
                           *(r.parts["wall_s"] for r in timed if r.parts)])
        self.spent["trials_s"] += self._trial_s
        self.spent["runs"] += runs
        self.spent["trials"] += 1
        self.spent["stopped_early"] += len(base.rounds) + len(v.rounds) < 2 * self.rounds and not v.inert
        verdict = judge(base, v)
        last = [r for r in (v if verdict["kept"] else base).rounds if r.value_ms is not None]
        self._last_round = last[-1] if last else None  # the configuration now, as last timed
        if self._baseline is None:
            self._baseline = verdict["baseline_step_ms"]
        if verdict["kept"] and verdict["baseline_step_ms"] and verdict["measured_step_ms"]:
            self._chain *= verdict["baseline_step_ms"] / verdict["measured_step_ms"]
        self._stage_row(summary, c, verdict)
        self._current = verdict["measured_step_ms"] if verdict["kept"] else (verdict["baseline_step_ms"]
                                                                              or self._current)
        self.say(f"stage {n}: {label} {'kept' if verdict['kept'] else 'rejected'}: {verdict['why']}")
        for k, words in via.items():
            self.option_trials.append({"knob": k, "value": c.knobs[k], "words": words, "kept": verdict["kept"]})
        return verdict["kept"], via, any(r.value_ms is None for r in v.rounds)

    def _check_final(self) -> None:
        """The original program against the tuned one, alternating: the cumulative speed-up measured, not
        chained over trials that ran minutes apart (its time is reserved from the budget once a knob is kept)."""
        label = self.configuration_text()
        self.say(f"final check: the program as it is against {label}, {self.rounds} round(s) each, plain "
                 f"({self.clock_text()})")
        variants = [timing.Variant({}, added={}, program=list(self.program)),
                    timing.Variant(self.knob_part(self.kept), added=dict(self.kept), program=self.current_program(),
                                     via_options=dict(self.via))]
        t0 = self.clock()
        base, v = timing.alternate(self.program, variants, self.rounds, self.python,
                                     progress=lambda m: self.say(f"final check: {m}"), logs=self.folder / "final",
                                     settled=lambda vs: self._no_time_for_a_run(final=True, variants=vs))
        self.final_check = judge(base, v)
        self._parts += [r.parts for x in (base, v) for r in x.rounds if r.parts]
        self.spent["final_check_s"] = self.clock() - t0

    def _stage_row(self, summary: dict, c: Candidate | None, verdict: dict) -> None:
        """The stage as tune.json keeps it. The trial's prediction is the one said before it ran (one prediction
        for one trial: the progress line and the table agree); the top findings' come off the profiled
        configuration's plain step where a trial measured it (this stage's baseline, else the last measured)."""
        own = try_runs.own_cost_ns(summary)
        plain = verdict.get("baseline_step_ms") or self._current
        profiled = profiled_step_ms(summary, ((summary.get("steps") or {}).get("summary") or {}).get("statistic")
                                    or "median")
        top = []
        for f in (summary.get("findings") or [])[:TOP_FINDINGS]:
            after = try_runs.plain_prediction_ms(f, summary, plain)
            top.append({"kind": f.get("kind"), "impact_ms": round((f.get("impact_ns") or 0) / 1e6, 3),
                        "knobs": next_knobs(f, self.kept, self.levers) or None,
                        "predicted_step_ms": round(after, 3) if after is not None else None,
                        "predicted_saving_ms": saving_ms(f)})
        self.stages.append({
            "stage": len(self.stages) + 1, "profile": self.last_profile.get("path"),
            "configuration": dict(self.kept), "profile_step_ms": round(profiled - own / 1e6, 3) if profiled else None,
            "top_findings": top, "knobs": dict(c.knobs) if c else None,
            "options": [w for ws in c.via.values() for w in ws] if c and c.via else None,
            "command": self.current_program() if self.via else None,
            "finding": c.finding.get("kind") if c else None,
            "predicted_step_ms": round(c.predicted_step_ms, 3) if c and c.predicted_step_ms is not None else None,
            "predicted_saving_ms": saving_ms(c.finding) if c else None,
            **{k: verdict.get(k) for k in ("baseline_step_ms", "measured_step_ms", "speedup", "statistic",
                                           "rounds_ms", "changed", "loss_max_rel_diff", "loss_noise_rel",
                                           "loss_bound_rel", "logs")},
            "kept": bool(verdict.get("kept")), "why": verdict["why"], "profile_reused": self._reused,
            "profile_s": round(self._fresh_profile_s, 1) if self._fresh_profile_s is not None else None,
            "trial_s": round(self._trial_s, 1) if c is not None and self._trial_s is not None else None,
            "elapsed_s": round(self.clock() - self._began, 1)})
        self._fresh_profile_s = self._trial_s = None

    def _nothing_left(self, summary: dict) -> str:
        tried = [declared.text(r) for r in self.rejected]
        return ("nothing left: every finding a knob or the program's own options apply was tried, or predicts less "
                f"than {MIN_SAVING:.0%}" + (f" (rejected before: {', '.join(tried)})" if tried else ""))

    def result(self) -> dict:
        from nvtx_trace.runner import permanent

        check = self.final_check
        if check and check.get("measured_step_ms"):
            base, final, source = check["baseline_step_ms"], check["measured_step_ms"], "final check"
        elif self._baseline is not None:
            # chained: a later trial's baseline can be timed in another statistic (a loader-bound step's mean where
            # the first was a median: an H200 ResNet-18 chained 214.59 ms median to 37.50 ms mean), so the ratios chain
            base, final, source = self._baseline, self._baseline / self._chain, "stages"
        else:
            base = final = next((s["profile_step_ms"] for s in self.stages if s["profile_step_ms"]), None)
            source = "profile"
        settings = (self.last_profile.get("summary") or {}).get("settings") or {}
        last = self.last_profile.get("summary") or {}
        return {
            "program": self.program, "rounds": self.rounds, "budget_s": self.budget_s,
            "elapsed_s": round(self.clock() - self._began, 1) if self._began else 0.0,
            "stopped": self.stopped, "baseline_step_ms": base, "final_step_ms": final,
            "speedup": base / final if base and final else None, "step_source": source,
            "kept_knobs": dict(self.kept), "stages": list(self.stages),
            "final_check": check,
            "remaining": remaining(last, self.levers) if last else [],
            "remaining_from": {"profile": self.last_profile.get("path"),
                               "configuration": self.last_profile.get("configuration")} if last else None,
            "permanent": permanent.lines(self.kept, settings, self.levers, self.via),
            "command": self.current_program(),
            "options": self._options(),
            "time": {**{k: round(v, 1) if isinstance(v, float) else v for k, v in self.spent.items()},
                     "per_run": {k: round(statistics.median(p[k] for p in self._parts), 2) for k in self._parts[0]}
                     if self._parts else None},
            "flops": self._flops(base),
        }

    def _options(self) -> list[dict]:
        """Each option the program declares, what it maps to, the values tune tried through it and the one kept."""
        mapped = {o.flag: knob for knob, found in program_options.levers(self.options).items()
                  for lever in found for o in (lever.option, lever.partner) if o is not None}
        failed = {w for words in self.unusable.values() for w in words}
        out = []
        for o in self.options:
            knob = mapped.get(o.flag)
            trials = [t for t in self.option_trials if o.flag in t["words"] or any(
                w.startswith(o.flag + "=") for w in t["words"])]
            kept = next((_said(o, t) for t in reversed(trials) if t["kept"]), None)
            out.append({"flag": o.flag, "kind": o.kind, "default": o.default, "maps_to": knob,
                        "values_tried": [_said(o, t) for t in trials], "kept": kept,
                        "failed": o.flag in failed or any(w.startswith(o.flag + "=") for w in failed)})
        return out

    def _flops(self, original_ms: float | None) -> dict | None:
        """Model FLOPs per step (counted once, in the first profile's warm-up), and what each measured
        configuration achieves of the GPU's dense peak for the math it runs in."""
        from nvtx_trace import device_peaks

        flops = self.first_settings.get("model_flops_per_step")
        if not flops:
            return None
        device = (self.first_settings.get("device") or {}).get("name")
        points = [("as it is", {}, original_ms)] if original_ms else []
        points += [(declared.text({**s["configuration"], **s["knobs"]}), {**s["configuration"], **s["knobs"]},
                    s["measured_step_ms"]) for s in self.stages if s["kept"] and s["measured_step_ms"]]
        rows = [{"label": label, "step_ms": round(step, 3),
                 **device_peaks.achieved(flops, step, device, device_peaks.precision_of(self.first_settings, knobs))}
                for label, knobs, step in points]
        return {"per_step": flops, "method": "torch.utils.flop_counter's formulas over one warm-up step "
                f"(step {self.first_settings.get('flops_step')}) of the first profile", "device": device,
                "stages": rows}


def script_of(program: list[str]) -> Path | None:
    """The script file the program runs (a torchrun job's ranks' too); None for a module."""
    from nvtx_trace.capture import torchrun

    launch = torchrun.parse(program)
    words = launch.program if launch is not None and launch.kind == "script" else program
    return Path(words[0]) if words and words[0] != "-m" and words[0].endswith(".py") else None


def _said(option, trial: dict):
    """What a trial set the option to, in the option's own words (``--micro-batch 64``: 64), where they say it;
    else the knob's value (a switch: True)."""
    words = trial["words"]
    for i, w in enumerate(words):
        if w in option.flags and option.kind == "value" and i + 1 < len(words):
            return program_options.typed(option, words[i + 1])
        for f in option.flags:
            if w.startswith(f + "="):
                return program_options.typed(option, w[len(f) + 1:])
    return trial["value"]
