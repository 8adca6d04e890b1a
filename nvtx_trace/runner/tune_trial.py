"""What a stage of ``tune`` tries, and whether it holds: decisions on a profile's findings and on timed rounds.

Apart from the stage loop (``tune_stages.py``) because they hold no state of it: each is a function of what a
profile found and what the runs measured, checked on rounds of known step times. The knob tried is the untried
finding's with the largest predicted saving; it is kept only when every round with it beats every round without
by MIN_SAVING, and its first losses agree within the knob's bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvtx_trace import knobs as declared
from nvtx_trace.runner import program_options, try_runs
from nvtx_trace.runner.timing import Variant, first_losses_moved, loss_noise

MIN_SAVING = 0.03  # a finding must predict at least this share of the step, and a trial measure it
CLEAR_WIN = 0.15  # a first round this much faster needs no second: rounds drift apart by a few percent


@dataclass
class Candidate:
    finding: dict
    knobs: dict  # what the trial adds to the configuration so far
    predicted_step_ms: float | None  # as a plain run keeps it (the tool's own cost taken out); None: no prediction
    profile_step_ms: float  # the step it comes off: the plain pace where one is known, else the profile's less
    # the tool's own cost
    via: dict = field(default_factory=dict)  # knob -> the program's own option words that applied it in the trial

    @property
    def saving(self) -> float:
        return 1 - self.predicted_step_ms / self.profile_step_ms if self.predicted_step_ms is not None else 0.0


def next_knobs(finding: dict, kept: dict, levers: dict | None = None) -> dict:
    """The knobs that take the finding's fix further than the configuration so far: those of its ``recommend``
    not already kept at that value, as its question applies them (a ``precision`` finding's next step only: TF32
    from fp32, then bf16). A knob only the program's own option applies (``sdpa``) counts where ``levers`` (the
    program's options, program_options.levers) can set it."""
    from nvtx_trace.analyzer.questions import knobs_of

    wanted = knobs_of(finding, kept)
    if declared.for_tune(wanted) != wanted:  # a value tune never applies (amp=fp16): none
        return {}
    wanted = {k: v for k, v in wanted.items() if not declared.get(k).option_with
              or _accumulation_matches(finding, levers or {}, k)}
    return {k: v for k, v in wanted.items() if declared.get(k).applied != "option"
            or program_options.words_for(levers or {}, k, v)}


def _accumulation_matches(finding: dict, levers: dict, knob: str) -> bool:
    """A knob of two options (a micro-batch and its accumulation steps): the second says what the profile counted
    (backward passes a step); a GAN's two backward calls, or an option read wrong (a config file the command
    names), fold nothing."""
    counted = (finding.get("evidence") or {}).get("micro_batches")
    return any(lever.partner is not None and lever.partner.value == counted for lever in levers.get(knob, []))


def profiled_step_ms(summary: dict, statistic: str) -> float | None:
    """The profile's step in ``statistic``, in ms (its median where it has no such figure)."""
    stats = (summary.get("steps") or {}).get("summary") or {}
    value = stats.get(f"step_ns_{statistic}") or stats.get("step_ns_median")
    return value / 1e6 if value else None


def candidates(summary: dict, kept: dict, rejected: list[dict], plain_ms: float | None = None,
               levers: dict | None = None) -> list[Candidate]:
    """The profile's findings a knob applies, not yet rejected, predicting at least MIN_SAVING; largest first.
    ``plain_ms``: the configuration's plain step where a trial measured it; savings are then net of the tool's
    cost that pace shows (try_runs.net_saving_ns), so a finding made of the tool's own cost is no candidate.
    After them, the findings a knob applies that predict nothing (the tool cannot say what their fix saves, e.g.
    hand-written attention, a GPU launches hold back): the trial measures it; largest impact first."""
    own = try_runs.own_cost_ns(summary)
    out, unpredicted = [], []
    for f in summary.get("findings") or []:
        knobs = next_knobs(f, kept, levers)
        pred = f.get("predicted")
        if not knobs or _rejected(knobs, rejected):
            continue
        if not pred or pred.get("step_ns") is None:
            step = plain_ms or profiled_step_ms(summary, "median")
            # a lever whose measured cost other findings count (a larger micro-batch, through the program's own
            # options) is tried last; another finding of no cost is not tried at all
            if step and (f.get("impact_ns") or all(declared.get(k).applied == "option" for k in knobs)):
                before = step if plain_ms else step - own / 1e6
                unpredicted.append(Candidate(f, knobs, None, max(before, 1e-9)))
            continue
        step = plain_ms or profiled_step_ms(summary, pred.get("statistic") or "median")
        if not step:
            continue
        before = step if plain_ms else step - own / 1e6
        c = Candidate(f, knobs, try_runs.plain_prediction_ms(f, summary, plain_ms), max(before, 1e-9))
        if c.saving >= MIN_SAVING:
            out.append(c)
    return sorted(out, key=lambda c: -c.saving) + sorted(unpredicted, key=lambda c: -(c.finding.get("impact_ns") or 0))


def saving_ms(finding: dict) -> float | None:
    """The finding's one prediction (``predicted.saving_ns``), as every command shows it."""
    saving = (finding.get("predicted") or {}).get("saving_ns")
    return round(saving / 1e6, 3) if saving is not None else None


def _rejected(knobs: dict, rejected: list[dict]) -> bool:
    """A knob rejected once is not tried again, whatever value a later profile proposes for it."""
    return any(k in r for r in rejected for k in knobs)


def remaining(summary: dict, levers: dict | None = None) -> list[dict]:
    """What neither a knob nor the program's own options apply, with its predicted gain on top of the configuration
    profiled: the user's edits. (A finding whose knob was kept or rejected is not among them: a knob did apply.)"""
    own = try_runs.own_cost_ns(summary)
    out = []
    for f in summary.get("findings") or []:
        if next_knobs(f, {}, levers):
            continue
        pred = f.get("predicted") or {}
        step = profiled_step_ms(summary, pred.get("statistic") or "median")
        after = try_runs.plain_prediction_ms(f, summary)
        before = step - own / 1e6 if step else None
        out.append({"kind": f.get("kind"), "title": f.get("title"), "fix": f.get("fix"),
                    "impact_ms": round((f.get("impact_ns") or 0) / 1e6, 3),
                    "predicted_step_ms": round(after, 3) if after is not None else None,
                    "saving_fraction": round(1 - after / before, 4) if after is not None and before else None,
                    "where": (f.get("evidence") or {}).get("where")})
    return sorted(out, key=lambda r: (-(r["saving_fraction"] or 0), -r["impact_ms"]))


def settled(variants: list, profiled: dict | None = None) -> str | None:
    """Why a trial needs no more rounds, or None: a run of it failed, or one of its rounds is already no faster
    than one of the baseline's (judge keeps a knob only when every round with it beats every round without, in
    either statistic): rejected whatever comes; or its first round is CLEAR_WIN faster in both statistics, far
    beyond the few percent rounds drift apart, in each half of its steps against each half of the baseline's (a
    load that came and went as they ran, 8 against 12 ms steps beside another nsys, is no clear win), and against
    ``profiled`` too: the baseline configuration's step as its profile measured it, per statistic, the tool's cost
    in it (a third sample, taken at another time: a baseline round all in a busy spell and the knob's all in a
    quieter one, 15.97 against 12.08 ms where the profile had 9.75, is no clear win either)."""
    base, v = variants[0], variants[-1]
    if any(r.value_ms is None for r in v.rounds):
        return "a run with it failed: it is rejected"
    mine = {s: [x for x in v.per_round(s) if x is not None] for s in ("median", "mean")}
    theirs = {s: [x for x in base.per_round(s) if x] for s in ("median", "mean")}
    if all(mine[s] and theirs[s] and max(mine[s]) >= min(theirs[s]) for s in mine):
        return "a round with it was already no faster than one without: it is rejected"
    if len(v.rounds) == 1 and all(clear(v.per_half(s), base.per_half(s)) for s in mine) \
            and all(clear(v.per_half(s), [pace]) for s, pace in (profiled or {}).items() if pace) \
            and not (len(base.rounds) == 1 and losses_moved_too_far(base, v)):
        return (f"its first round is {CLEAR_WIN:.0%} faster or more, in each half of its steps and against the "
                "profile's pace: clear beyond the rounds' drift")
    return None


def losses_moved_too_far(base: Variant, v: Variant) -> bool:
    """judge's loss test: the first losses moved beyond the knob's bound plus the baseline's own run-to-run
    difference. With one baseline round that difference is unknown, and an unseeded program (a random
    initialisation, a shuffle) moves that much by itself: settled then waits for the next round rather than let
    judge reject a clear win (an H200 image-folder classifier: --workers 7 2.33x, losses 25 % apart on one round a
    side)."""
    diff = first_losses_moved(base, v)
    return diff is not None and diff > declared.loss_bound(v.trial) + (loss_noise(base) or 0)


def clear(mine: list[float], theirs: list[float]) -> bool:
    """Each value with the knob CLEAR_WIN below each without."""
    return bool(mine and theirs) and max(mine) <= (1 - CLEAR_WIN) * min(theirs)


def spread(*sides: list[float]) -> float:
    """How far one configuration's own rounds differ (the widest side): a saving no larger is the machine's noise."""
    return max((max(x) - min(x) for x in sides if len(x) > 1), default=0.0)


def judge(base: Variant, v: Variant) -> dict:
    """Measured against the configuration so far, in one statistic (the mean where either's steps are uneven);
    kept only if faster by MIN_SAVING with every variant round faster than every baseline round, by more than
    either side's rounds differ among themselves, and the losses within the knob's bound beyond the baseline's
    own noise."""
    stat = "mean" if "mean" in (v.statistic, base.statistic) else "median"
    before, after = base.value(stat), v.value(stat)
    mine, theirs = [x for x in v.per_round(stat) if x is not None], [x for x in base.per_round(stat) if x]
    noise = loss_noise(base)
    diff = first_losses_moved(base, v)
    bound = declared.loss_bound(v.trial)  # how far the first losses may move with them (each knob declares it)
    out = {"statistic": stat, "baseline_step_ms": before, "measured_step_ms": after,
           "rounds_ms": {"baseline": base.per_round(stat), "variant": v.per_round(stat)},
           "speedup": before / after if before and after else None,
           "changed": v.changed(),
           "loss_max_rel_diff": diff, "loss_noise_rel": noise, "loss_bound_rel": bound,
           "logs": [str(r.log) for r in v.rounds if r.log]}
    failures = [r.why for r in v.rounds if r.value_ms is None]
    lost = [x for x in (v.rounds[0].losses if v.rounds else []) if x is not None and not (abs(x) < float("inf"))]
    if lost and any(x is not None and not (abs(x) < float("inf")) for r in base.rounds for x in r.losses):
        lost = []  # NaN without the knob too: the program's, not the knob's
    if v.inert:
        why = f"it changed nothing in this program ({'; '.join(out['changed']) or 'no line from the knob'})"
    elif failures:
        why = f"a run failed: {failures[0]}"
    elif not before or not after:
        why = "no step time was measured"
    elif after > (1 - MIN_SAVING) * before:
        why = f"{before / after:.2f}x: less than {MIN_SAVING:.0%} faster"
    elif mine and theirs and max(mine) >= min(theirs):
        why = (f"{before / after:.2f}x, but within the spread of the rounds (slowest with it {max(mine):.2f} ms, "
               f"fastest without {min(theirs):.2f} ms)")
    elif before - after <= (noisy := spread(mine, theirs)):
        why = (f"{before / after:.2f}x, but the rounds of one side differ by {noisy:.2f} ms, as much "
               f"as the {before - after:.2f} ms it saves")
    elif lost:
        why = "the loss became NaN or infinite"
    elif losses_moved_too_far(base, v):
        why = (f"the first steps' losses moved {diff:.2%}, beyond the {bound:.2%} this knob allows"
               + (f" plus the baseline's own {noise:.2%}" if noise else ""))
    else:
        out["kept"] = True
        allowed = f"bound {bound:.2%}" + (f" + the baseline's own {noise:.2%}" if noise else "")
        out["why"] = (f"{before / after:.2f}x faster, every round; losses "
                      + ("not recorded" if diff is None else f"within {diff:.2%} ({allowed})"))
        return out
    out["kept"], out["why"] = False, why
    return out
