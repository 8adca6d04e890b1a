"""What each fix would do to the steady step, from measured parts only (``findings[].predicted``).

Each prediction is for that fix alone: the step as it is now, less the time the finding measured per
step, never below what the step needs anyway (the GPU's own work per step for fixes that only remove
idle time). Where the measured parts cannot say (no steps; a GPU-side saving on a GPU that is mostly
idle, so the step is bound elsewhere) there is no prediction rather than a guess.
"""

from __future__ import annotations

import numpy as np

from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.measures import loader_waits
from nvtx_trace.analyzer.measures.step_times import typical_step_ns
from nvtx_trace.units import count, ms

GPU_BOUND = 0.8  # a GPU-side saving shortens the step 1:1 when the GPU is this busy
# ... or, on a GPU less busy, when the idle gaps shorter than --min-gap-ms (kernels launched slower than the GPU
# runs them) add up to less than this share of the step: the rest of its idle time is serial host work (after a
# sync, a batch fetched in the main process, a framework's logging) that runs whatever the GPU's speed. Held out
# on an H200 with 8 of 16 CPUs: an HF Trainer in fp32, 73 % busy, 17 % of the step in short gaps: TF32 measured
# 1.50x and 1.90x in two runs; a launch-bound MLP, 8 % busy, 85 % in short gaps: TF32 1.03x; the launch-bound
# samples shipped here idle 41-89 % of the step in short gaps.
LAUNCH_BOUND_SHARE = 0.25


def loader(analysis, fetch_ns_median: float, compute: float | None, workers: int | None,
           sustained: float | None = None) -> dict | None:
    """The steady step once the loader keeps up as far as it can: never faster than the measured compute,
    never faster than ``workers`` workers deliver batches at their measured fetch time. ``sustained``: the
    step once the batches prefetched before the window run out, when the loader falls behind."""
    now, stat = steady_step(analysis)
    if not compute or not workers or not now:
        return None
    ahead = ""
    if sustained and sustained > now:
        now, ahead = sustained, f"steps slow to {ms(sustained)} once the prefetched batches run out; "
    delivery = float(fetch_ns_median) / workers
    step = min(now, max(compute, delivery))
    return {"step_ns": int(step), "saving_ns": int(now) - int(step), "statistic": stat,
            "basis": f"{ahead}a step computes in {ms(compute)} without its waits; {count(workers, 'worker')} at "
                     f"{ms(fetch_ns_median)} per batch {'delivers' if workers == 1 else 'deliver'} one every {ms(delivery)}",
            "loader_pace_ns": int(min(now, delivery))}


def add_predictions(analysis, findings: list[Finding], idle_kinds: tuple[str, ...], rules: dict) -> None:
    """Fill ``predicted`` (and the fix's "Expected:" sentence) for findings whose question made none, once every
    finding is built: ``rules`` (kind -> rule, each question's ``Question.predicts``), else, for a kind whose
    impact is GPU time lost idle (``idle_kinds``), that idle per step removed (``idle_removed``)."""
    for f in findings:
        if f.predicted is None:
            rule = rules.get(f.kind) or (idle_removed if f.kind in idle_kinds else None)
            f.predicted = rule(analysis, f) if rule is not None else None
            f.fix = with_expected(f.fix, f.predicted)


def with_expected(fix: str, predicted: dict | None, part: str | None = None) -> str:
    """The fix, then what it is expected to do to the step, as one more sentence; ``part``: the part of a fix
    of several that the prediction is for (``predicted["for"]``)."""
    if predicted and predicted["saving_ns"] <= 0 and predicted.get("bound_by") == "loader":
        return fix.rstrip(" .") + f". Expected: no shorter step while {predicted['basis']}; fix the loader first."
    if not predicted or predicted["saving_ns"] <= 0:
        return fix
    if part:
        predicted["for"] = part
    mean = "mean " if predicted.get("statistic") == "mean" else ""
    label = f"Expected with {part} alone" if part else "Expected"
    return (fix.rstrip(" .") + f". {label}: {mean}step {ms(predicted['step_ns'] + predicted['saving_ns'])} -> "
            f"about {ms(predicted['step_ns'])} ({predicted['basis']}).")


def steady_step(analysis) -> tuple[float | None, str]:
    """The steady step predictions start from, and its statistic (the mean when steps are uneven)."""
    if not analysis.steps:
        return None, "median"
    value, stat = typical_step_ns(analysis.steps.summary())
    return (float(value) if value else None), stat


def _stat(values: np.ndarray, stat: str) -> float:
    return float(values.mean() if stat == "mean" else np.median(values))


def collective_wait_by_step(analysis) -> np.ndarray:
    """Each steady step's time in which its GPU spun inside collectives waiting for a peer, no other kernel
    running (zeros without collectives): in a rank that waits for a straggler, its host syncs wait that long
    for the GPU, so it is neither compute nor GPU work."""
    steady = analysis.steps.steady if analysis.steps else None
    if steady is None or not len(steady):
        return np.zeros(0)
    if "collective_wait" not in analysis.steps.measured:
        return np.zeros(len(steady))
    waits = steady["collective_wait_ns"].to_numpy(np.float64)
    return waits if (~np.isnan(waits)).any() else np.nan_to_num(waits)  # unknown in every step: counted as 0


def _known_waits(analysis) -> np.ndarray:
    """Steady steps whose collectives all found a partner on the other GPUs (all steps if none did, as the
    warning then says): in the others the waiting, and so the compute, is unknown."""
    return ~np.isnan(collective_wait_by_step(analysis))


def compute_per_step(analysis) -> float | None:
    """What a steady step takes when it waits for nothing: its time less its loader waits and its GPU's
    waiting in collectives, step by step, then the typical statistic (as the step predictions start from)."""
    steady = analysis.steps.steady if analysis.steps else None
    if steady is None or not len(steady):
        return None
    _, stat = steady_step(analysis)
    free = (steady["duration_ns"] - steady["loader_wait_ns"]).to_numpy() - collective_wait_by_step(analysis)
    return max(_stat(free[_known_waits(analysis)], stat), own_work_per_step(analysis, stat), 1.0)


def own_work_per_step(analysis, stat: str) -> float:
    """The GPU's busy time per steady step less its waiting inside collectives, step by step (0 unmeasured)."""
    if not analysis.steps or "gpu_busy" not in analysis.steps.measured or not len(analysis.steps.steady):
        return 0.0
    busy = analysis.steps.steady["gpu_busy_ns"].to_numpy() - collective_wait_by_step(analysis)
    return max(_stat(np.maximum(busy, 0.0)[_known_waits(analysis)], stat), 0.0)


def _gpus(analysis) -> int:
    return max(1, len(analysis.idle.devices) if analysis.idle else 1)


def idle_removed(analysis, f: Finding, of_others: bool = False, lost: str = "GPU idle",
                 more_workers: bool = False) -> dict | None:
    """The steady step less the idle the finding measured per step (summed over the GPUs of the steady window;
    ``of_others``: over the other GPUs only, as a straggler's impact is their waiting), never below the GPU's
    own work per step. ``more_workers``: the fix is more DataLoader workers (a straggler slowed by its loader)."""
    now, stat = steady_step(analysis)
    if not now:
        return None
    n_gpus = _gpus(analysis)
    per_step = f.impact_ns / (max(1, n_gpus - 1) if of_others else n_gpus) / max(1, len(analysis.steps.steady))
    floor = own_work_per_step(analysis, stat)
    step = max(now - per_step, floor, 0.0)
    what = f"{ms(per_step)} of {lost} per step goes" + (f"; the GPU's own work is {ms(floor)} a step" if floor else "")
    return _within_loader_pace(analysis, now, step, stat, what, more_workers)


def work_per_step(analysis, ns: float) -> float:
    """``ns`` over the steady window (all GPUs) as the time of one GPU's steady step."""
    return ns / _gpus(analysis) / max(1, len(analysis.steps.steady))


def work_removed(analysis, per_step_ns: float, what: str) -> dict | None:
    """The steady step less ``per_step_ns`` of work (GPU kernels, copies), never below the loader's pace."""
    now, stat = steady_step(analysis)
    if not now:
        return None
    return _within_loader_pace(analysis, now, max(now - per_step_ns, 0.0), stat, what)


def _within_loader_pace(analysis, now: float, step: float, stat: str, what: str, more_workers: bool = False) -> dict | None:
    """No step is shorter than the loader's delivery, which the fix leaves as it is (unless the fix is more
    workers: then their pace, as many as the cores allow)."""
    feed = loader_waits.pace(analysis)
    if feed is not None and more_workers:
        usable = loader_waits.usable_workers(analysis, feed.cpu_share)
        if usable is None or usable > feed.workers:  # else more workers cannot be had: the loader bounds
            fetch = loader_waits.contended_fetch_ns(feed.fetch_ns, feed.workers, usable or feed.workers, analysis.cpu_cores,
                                                    loader_waits.processes_per_host(analysis)[0], compute_per_step(analysis),
                                                    feed.cpu_share)
            return _with_more_workers(fetch, usable, now, step, stat, what)
    if feed is None or feed.interval_ns <= step:
        return _expected(now, step, stat, what) if now - step > 0 else None
    own = step
    step = min(now, feed.interval_ns)
    return _expected(now, step, stat, (what + "; " if now > step else "") + f"the loader's {feed.words()}", "loader",
                     _workers_to_keep_up(analysis, feed, own))


def launch_gaps_per_step(analysis) -> float | None:
    """A GPU's idle per steady step (the mean over GPUs) in gaps shorter than --min-gap-ms: launches not keeping
    up."""
    if (not analysis.idle or not analysis.idle.devices or not analysis.window or not analysis.steps
            or not len(analysis.steps.steady)):
        return None
    from nvtx_trace.analyzer.basis import short_idle

    total = sum(short_idle(analysis, dev)[0] for dev in analysis.idle.devices)
    return total / len(analysis.idle.devices) / len(analysis.steps.steady)


def launch_share(analysis) -> float | None:
    """The share of the steady step a GPU idles in gaps shorter than --min-gap-ms (launch_gaps_per_step); None
    where that is not measured."""
    now, _ = steady_step(analysis)
    launches = launch_gaps_per_step(analysis)
    return launches / now if now and launches is not None else None


def launch_bound(analysis) -> bool:
    """Launches hold the GPU back: it is busy less than GPU_BOUND and idles LAUNCH_BOUND_SHARE of the step or more
    in gaps shorter than --min-gap-ms."""
    busy = (analysis.steps.summary() or {}).get("gpu_busy_fraction") if analysis.steps else None
    share = launch_share(analysis)
    return bool(busy is not None and busy < GPU_BOUND and share is not None and share > LAUNCH_BOUND_SHARE)


def not_gpu_bound(analysis) -> str:
    """Why a GPU-work fix has no prediction: the GPU is not what sets the step's pace yet."""
    busy = (analysis.steps.summary() or {}).get("gpu_busy_fraction") if analysis.steps else None
    if busy is None:
        return ""
    share = launch_share(analysis)
    if share is not None and share > LAUNCH_BOUND_SHARE:
        return (f". No prediction: the GPU is busy only {busy * 100:.0f} % of the step and idles "
                f"{share * 100:.0f} % of it in gaps under {ms(analysis.min_gap_ns)} while the host launches "
                "kernels, so less GPU work shortens the step only once the launches keep up")
    return (f". No prediction: the GPU is busy only {busy * 100:.0f} % of the step, so less GPU work shortens the "
            "step only once what keeps it idle is fixed")


def gpu_work_saved(analysis, per_step_ns: float, what: str, gpu_bound: bool = True) -> dict | None:
    """The steady step once ``per_step_ns`` of GPU work per step (per GPU) is gone, never below the loader's
    delivery pace; with ``gpu_bound``, only when the GPU is busy enough for its work to set the pace (GPU_BOUND).
    A fix that also removes kernel launches (fusion) shortens a launch-bound step too: ``gpu_bound=False``."""
    now, stat = steady_step(analysis)
    busy_share = analysis.steps.summary().get("gpu_busy_fraction") if analysis.steps else None
    if not now or per_step_ns <= 0 or busy_share is None:
        return None
    if gpu_bound and busy_share < GPU_BOUND:
        share = launch_share(analysis)
        if share is None or share > LAUNCH_BOUND_SHARE:
            return None  # the host's launches hold the GPU back: less GPU work would not shorten the step
        what += (f"; the GPU's idle stays: {share * 100:.0f} % of the step in gaps under {ms(analysis.min_gap_ns)}, too "
                 "little for launches to hold it back, the rest in longer gaps of host work (after syncs, batches "
                 "fetched, the framework's own bookkeeping)")
    step = max(now - per_step_ns, 0.0)
    feed = loader_waits.pace(analysis)
    if feed is not None and feed.interval_ns > step:
        own = step
        step = min(now, feed.interval_ns)
        return _expected(now, step, stat, (what + "; " if now > step else "") + f"the loader's {feed.words()}",
                         "loader", _workers_to_keep_up(analysis, feed, own))
    return _expected(now, step, stat, what)


def host_time_saved(analysis, per_step_ns: float, what: str) -> dict | None:
    """The steady step once ``per_step_ns`` of the training thread's time per step is gone (calls that block it,
    launches it no longer makes), never below the GPU's own work per step nor the loader's delivery pace."""
    now, stat = steady_step(analysis)
    if not now or per_step_ns <= 0:
        return None
    floor = own_work_per_step(analysis, stat)
    step = max(now - per_step_ns, floor, 0.0)
    if step > now - per_step_ns:
        what += f"; no shorter than the GPU's own work, {ms(floor)} a step"
    return _within_loader_pace(analysis, now, step, stat, what)


def _expected(now: float, step: float, stat: str, basis: str, bound_by: str | None = None,
              with_workers: dict | None = None) -> dict:
    """A prediction; bound by the loader (or the cores' workers), the step is the loader's pace, which the tool's
    own cost on the training thread does not slow (``loader_pace_ns``: what ``try`` keeps of it), and
    ``with_workers`` says what the fix gives together with more workers, where the cores allow more."""
    out = {"step_ns": int(step), "saving_ns": int(now) - int(step), "statistic": stat, "basis": basis}
    return out | ({"bound_by": bound_by, "loader_pace_ns": int(step)} if bound_by else {}) | (
        {"with_workers": with_workers} if with_workers else {})


MORE_WORKERS_GAIN = 0.03  # more workers go with a fix only where they shorten its step by this share


def _workers_to_keep_up(analysis, feed, step: float) -> dict | None:
    """A fix the loader's pace holds back gives its own ``step`` only with workers that deliver a batch that often:
    as many as that needs (each added one slowing the others on a shared host), no more than the cores allow.
    ``{"workers", "step_ns", "loader_pace_ns"}``, or None where no more workers can be had or they gain nothing."""
    ranks = loader_waits.processes_per_host(analysis)[0]
    usable = loader_waits.usable_workers(analysis, feed.cpu_share)
    need = loader_waits.workers_needed(feed.fetch_ns, max(step, 1.0), feed.workers, analysis.cpu_cores, ranks,
                                       feed.cpu_share)
    workers = min(need, usable) if usable is not None else need
    if workers <= feed.workers:
        return None
    fetch = loader_waits.contended_fetch_ns(feed.fetch_ns, feed.workers, workers, analysis.cpu_cores, ranks, step,
                                            feed.cpu_share)
    pace = fetch / workers
    if max(step, pace) >= (1 - MORE_WORKERS_GAIN) * feed.interval_ns:  # not worth workers of their own
        return None
    return {"workers": int(workers), "step_ns": int(max(step, pace)), "loader_pace_ns": int(pace)}


def _with_more_workers(fetch_ns: float, usable: int | None, now: float, step: float, stat: str,
                       what: str) -> dict | None:
    """A straggler slowed by its loader is fixed by more workers, as many as the cores allow: the step is then
    no shorter than their delivery pace at ``fetch_ns`` a batch each (the loader finding's own advice and bound,
    contention counted)."""
    bound = None
    if usable is not None and fetch_ns / usable > step:
        step, bound = min(now, fetch_ns / usable), "cores"
        what += f"; {usable} workers, as many as the CPU cores allow, deliver a batch every {ms(fetch_ns / usable)}"
    return _expected(now, step, stat, what, bound) if now - step > 0 else None
