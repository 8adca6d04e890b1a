"""Where are the training steps, and what does a steady step spend its time on?

Training steps found in the trace's own rhythm, for reports without step ranges.

Two methods: NVTX ranges that recur once per iteration (``infer_from_ranges``: nvtx_autotrace's
``optimizer.step``, or a user's ``forward``/``train_step``), and, without such ranges, the
kernel sequence's period (``infer_steps``), described here.

A report captured with plain ``nsys profile`` has no ``step N`` ranges; analyzed as one
window, start-up (CUDA context, one-time uploads, cuDNN autotuning) dominates it. But a
training loop launches the same kernels in the same order every iteration, so the
sequence of kernel names on the busiest GPU repeats with a fixed period P (in kernels):
``name[i] == name[i + P]`` for nearly every i of the steady state.

1. Candidate periods come from the kernels themselves: for each kernel name that recurs,
   the median distance (in kernels) between its bursts of occurrences.
2. Each candidate P is scored by how often the sequence repeats at that shift over the
   second half of the trace (the steady state); the smallest P scoring >= MIN_MATCH wins
   (a multiple of the period matches as well; a layer's period does not, since backward
   layers and the head differ from forward layers).
3. The phase: iterations are cut before the kernel that, in the median iteration, follows
   the longest GPU gap (loading the next batch, the optimizer's sync, ``loss.item()``).
4. Steps are the spans between consecutive cuts from the first position where the repeat
   holds; everything before is start-up.

The result is a table of steps in the shape the step analysis reads, its method, and the
match fraction as a confidence figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.measures.instrumentation_cost import read_record
from nvtx_trace.analyzer.measures.startup_time import FIRST_TIME_NS, first_time_code_ns
from nvtx_trace.analyzer.measures.step_times import STEP_PARTS, analyze_steps
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.errors import UsageError
from nvtx_trace.units import ms, pct

MIN_MATCH = 0.9  # share of steady-state positions where the sequence repeats at the period
MIN_STEPS = 4
MAX_CANDIDATES = 200  # kernel names tried as period markers (the most frequent first)


@dataclass
class InferredSteps:
    steps: pd.DataFrame  # step, start_ns, end_ns, pid (GPU-side spans of one process's iterations)
    method: str  # "inferred:kernel-period"
    confidence: float  # share of steady-state kernels that repeat at the period
    period_kernels: int
    startup_end_ns: int  # where the first inferred step begins: before it, start-up
    marker: str = ""  # inferred:nvtx-period: the recurring range that marks each iteration


def infer_steps(gpu_ops: pd.DataFrame) -> InferredSteps | None:
    """Iterations of the process that launches the most kernels on its busiest GPU, or None."""
    kernels = gpu_ops[(gpu_ops["kind"] == 0) & (gpu_ops["name_id"] >= 0)]
    if len(kernels) < MIN_STEPS * 4:
        return None
    (device, pid), _ = max(kernels.groupby(["device_id", "pid"]).groups.items(), key=lambda kv: len(kv[1]))
    mine = kernels[(kernels["device_id"] == device) & (kernels["pid"] == pid)].sort_values("start_ns")
    names = mine["name_id"].to_numpy()
    start, end = mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy()
    period, match = _best_period(names)
    if period is None:
        return None
    first = _first_repeating(names, period)
    last = _last_repeating(names, period)  # evaluation or tear-down after training is not cut into steps
    phase = _phase(start, end, first, period)
    cuts = np.arange(first + phase, last + 1, period)
    if len(cuts) < MIN_STEPS + 1:
        return None
    ends = start[cuts[1:]]
    if last + 1 - cuts[-1] >= period:  # the last whole iteration: no next cut, it ends with its own kernels
        cuts = np.append(cuts, cuts[-1] + period)
        ends = np.append(ends, end[cuts[-1] - 1])
    steps = pd.DataFrame({"step": np.arange(len(cuts) - 1), "start_ns": start[cuts[:-1]], "end_ns": ends,
                          "pid": int(pid)})
    return InferredSteps(steps=steps, method="inferred:kernel-period", confidence=round(float(match), 3),
                         period_kernels=int(period), startup_end_ns=int(start[cuts[0]]))


def _candidate_periods(names: np.ndarray) -> list[int]:
    ids, counts = np.unique(names, return_counts=True)
    order = np.argsort(-counts)[:MAX_CANDIDATES]
    periods = set()
    for name in ids[order]:
        pos = np.flatnonzero(names == name)
        if len(pos) < MIN_STEPS:
            continue
        gaps = np.diff(pos)
        burst_starts = pos[np.concatenate(([True], gaps > max(2, np.median(gaps) // 4)))]
        if len(burst_starts) >= MIN_STEPS:
            periods.add(int(np.median(np.diff(burst_starts))))
    return sorted(p for p in periods if 0 < p <= len(names) // MIN_STEPS)


def _best_period(names: np.ndarray) -> tuple[int | None, float]:
    tail = names[len(names) // 2:]
    best, best_match = None, 0.0
    for p in _candidate_periods(names):
        if p >= len(tail):
            break
        match = float(np.mean(tail[p:] == tail[:-p]))
        if match >= MIN_MATCH and (best is None or match > best_match + 0.02):
            best, best_match = p, match  # the smallest period that repeats (its multiples repeat too)
        if best is not None and p > best and match >= MIN_MATCH:
            break
    return best, best_match


def _repeating(names: np.ndarray, period: int) -> tuple[np.ndarray, int]:
    """Positions i where names[i:i+w] mostly equal names[i+P:i+P+w] (w = half a period), and w."""
    same = names[period:] == names[:-period]
    window = max(1, period // 2)
    run = np.convolve(same.astype(np.int32), np.ones(window, np.int32), mode="valid") >= window * MIN_MATCH
    return np.flatnonzero(run), window


def _first_repeating(names: np.ndarray, period: int) -> int:
    """First position from which the sequence keeps repeating (start-up kernels do not)."""
    hits, _ = _repeating(names, period)
    return int(hits[0]) if len(hits) else 0


def _last_repeating(names: np.ndarray, period: int) -> int:
    """Last position up to which the sequence still repeats (one past the last kernel of the last period)."""
    hits, window = _repeating(names, period)
    return int(hits[-1] + window + period - 1) if len(hits) else len(names) - 1


def _phase(start: np.ndarray, end: np.ndarray, first: int, period: int) -> int:
    """Offset within the period whose kernel follows the longest GPU gap in the median iteration."""
    n_iter = (len(start) - first - 1) // period
    if n_iter < 1:
        return 0
    idx = first + 1 + np.arange(n_iter * period)
    gaps = np.maximum(start[idx] - end[idx - 1], 0).reshape(n_iter, period)
    return int((np.argmax(np.median(gaps, axis=0)) + 1) % period)


def infer_from_ranges(ranges: pd.DataFrame, prefer: str = "optimizer.step ") -> InferredSteps | None:
    """Iterations from NVTX ranges that recur once per iteration on the training thread (no ``step N``).

    ``optimizer.step`` ranges (nvtx_autotrace's, one per step by construction) decide when present:
    too few of them is no answer, rather than a finer rhythm (a ``backward`` per micro-batch). Otherwise
    the least frequent range that still recurs evenly (a layer called twice per iteration does not; a
    range per micro-batch can, which the text says). Steps run from one occurrence's start to the next.
    """
    if not len(ranges):
        return None
    closed = ranges[~ranges["open"]] if "open" in ranges else ranges
    if not len(closed):
        return None
    main = closed["gtid"].value_counts().idxmax()  # the training thread: most ranges (not a loader worker)
    closed = closed[closed["gtid"] == main]
    names = closed["name"].astype(str)
    opt = closed[names.str.startswith(prefer).to_numpy()]
    if len(opt):
        if len(opt) <= MIN_STEPS:
            return None
        # by construction one per step; cut where they end, as nvtx_autotrace's own step ranges are
        return _from_rows(opt.sort_values("start_ns"), str(opt["name"].iloc[0]), confidence=1.0, at="end_ns")
    best = None
    for name, n in names.value_counts().items():
        if n <= MIN_STEPS:
            break
        rows = closed[(names == name).to_numpy()].sort_values("start_ns")
        score = _evenness(rows["start_ns"].to_numpy())
        if score >= 0.8 and (best is None or (-n, score) > best[0]):  # the coarsest even rhythm: not a layer's
            best = ((-n, score), rows, name)
    return _from_rows(best[1], best[2]) if best is not None else None


def _evenness(starts: np.ndarray) -> float:
    diffs = np.diff(starts)
    med = float(np.median(diffs)) if len(diffs) else 0.0
    return float(np.mean(np.abs(diffs - med) <= 0.5 * med)) if med > 0 else 0.0


def _from_rows(rows: pd.DataFrame, name: str, confidence: float | None = None, at: str = "start_ns") -> InferredSteps:
    starts = rows[at].to_numpy()
    steps = pd.DataFrame({"step": np.arange(len(starts) - 1), "start_ns": starts[:-1], "end_ns": starts[1:],
                          "pid": int(rows["pid"].iloc[0])})
    conf = confidence if confidence is not None else _evenness(starts)
    return InferredSteps(steps=steps, method="inferred:nvtx-period", confidence=round(conf, 3),
                         period_kernels=0, startup_end_ns=int(starts[0]), marker=name)


def _run(ctx: Context) -> None:
    analysis = ctx.result
    busy_by_pid: dict[int, iv.Set] = {}
    for dev in analysis.idle.devices if analysis.idle else []:
        for pid in dev.pids:
            busy_by_pid[pid] = iv.merge(busy_by_pid.get(pid, iv.empty()), dev.busy)
    infer = None if ctx.step_range else (lambda: _infer(ctx.trace))
    # A capture window nvtx_autotrace opened after warm-up says so in the report: every door then leaves no
    # further step out, as `run` (which saw the window open) does.
    opened = read_record(ctx.trace.ranges, names.WINDOW_PREFIX) if len(ctx.trace.ranges) else None
    first = opened.get("first_step") if opened else None
    first = first if isinstance(first, int) and not isinstance(first, bool) else None
    warmup = 0 if ctx.warmup_steps is None and first is not None else ctx.warmup_steps
    analysis.steps = analyze_steps(ctx.trace.ranges, busy_by_pid if analysis.idle else None,
                                   analysis.loader.waits if analysis.loader else None,
                                   analysis.sync.calls if analysis.sync else None, warmup, infer=infer,
                                   step_range=ctx.step_range)
    if analysis.steps is not None:
        analysis.steps.capture_first_step = first
        program = (opened or {}).get("program")
        analysis.steps.program = program if isinstance(program, str) and program else None
    if analysis.steps is not None and warmup is None:
        t = analysis.steps.table
        analysis.steps.extend_warmup(first_time_code_ns(ctx.trace, t["start_ns"].to_numpy(), t["end_ns"].to_numpy()),
                                     FIRST_TIME_NS)
    if analysis.steps is None and ctx.step_range is not None:
        raise UsageError(f"--step-range {ctx.step_range!r} matches no NVTX range in {ctx.trace.info.path} ("
                         f"{_range_names(ctx.trace.ranges)}); give a regex of your step ranges' name")
    if analysis.steps is not None and ctx.warmup_steps is not None and ctx.warmup_steps >= len(analysis.steps.table):
        raise UsageError(f"--warmup-steps {ctx.warmup_steps} leaves no steady step: {ctx.trace.info.path} holds "
                         f"{len(analysis.steps.table)} step(s) ({analysis.steps.how}); give fewer, or leave it out to "
                         "detect them")
    if analysis.steps is None:
        analysis.skipped["steps"] = ("no step ranges (`step N` from nvtx_autotrace, or user ranges like `step 3`), and the "
                                     "kernel sequence shows no repeating iteration")


def _range_names(ranges: pd.DataFrame, shown: int = 6) -> str:
    """The report's most frequent NVTX range names, numbers written as N (``step N``: 30), for a pattern to aim at."""
    if not len(ranges):
        return "it has no NVTX ranges"
    counts = ranges["name"].astype(str).str.replace(r"\d+", "N", regex=True).value_counts()
    listed = ", ".join(f"{name!r} x{n}" for name, n in counts.head(shown).items())
    return f"its most frequent ranges: {listed}" + (f" and {len(counts) - shown} more" if len(counts) > shown else "")


def _infer(trace):
    """nvtx_autotrace's optimizer ranges mark iterations exactly; else the kernel sequence's period; else a
    range that recurs evenly on the training thread (a CPU-only report)."""
    by_ranges = infer_from_ranges(trace.ranges)
    if by_ranges is not None and by_ranges.marker.startswith("optimizer.step "):
        return by_ranges
    by_kernels = infer_steps(trace.gpu_ops) if trace.has_gpu_activity else None
    return by_kernels or by_ranges


def _json(analysis) -> dict:
    if not analysis.steps:
        return {"steps": None}
    table = analysis.steps.table.astype(object)
    for what in STEP_PARTS:
        if what not in analysis.steps.measured:  # not captured: unknown, not zero
            table[f"{what}_ns"] = None
        else:  # nanoseconds are whole; NaN (unknown in that step) is null
            table[f"{what}_ns"] = [None if pd.isna(v) else int(v) for v in table[f"{what}_ns"]]
    return {"steps": {"source": analysis.steps.source, "how": analysis.steps.how, "confidence": analysis.steps.confidence,
                      "summary": analysis.steps.summary(), "table": table}}


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


def _text(analysis, view) -> None:
    s = analysis.steps.summary() if analysis.steps else {}
    if not s:
        return
    unknown = any(s.get(f"{k}_fraction") is None for k in ("gpu_busy", "loader_wait", "sync_wait"))
    modes = s.get("modes")
    pace = (f"mean {ms(s['step_ns_mean'])}: steps come in two kinds, {modes['low_steps']} of about "
            f"{ms(modes['low_ns'])} and {modes['high_steps']} of about {ms(modes['high_ns'])} (a median, "
            f"{ms(s['step_ns_median'])}, would describe neither)" if modes else
            f"mean {ms(s['step_ns_mean'])}: uneven steps, a median of {ms(s['step_ns_median'])} hides the long ones, "
            f"p90 {ms(s['step_ns_p90'])}" if s.get("statistic") == "mean" else
            f"median {ms(s['step_ns_median'])}, p90 {ms(s['step_ns_p90'])}")
    view.print(
        f"Steps ({analysis.steps.how}): {s['steps']}, {s['warmup_steps']} of them warm-up; steady state {pace}. "
        f"Of step time: GPU busy {_pct(s['gpu_busy_fraction'])}" + _spinning(s) + ", waiting for data "
        f"{_pct(s['loader_wait_fraction'])}, in host syncs {_pct(s['sync_wait_fraction'])}"
        + (" (-: not captured)" if unknown else ""), highlight=False)


def _spinning(s: dict) -> str:
    """The part of busy time that is the GPU spinning in collectives until a peer arrives: waiting, not work."""
    spin = s.get("collective_wait_fraction")
    return f" ({_pct(spin)} of step time spinning in collectives for a peer)" if spin is not None and spin >= 0.01 else ""


QUESTION = Question(
    name="steps", order=70, run=_run, needs=("idle", "loader", "sync"),
    json_keys=("steps",), json_at=60, to_json=_json,
    tables=lambda analysis: {"steps": analysis.steps.table} if analysis.steps else {},
    text=_text, text_at=50,
)
