"""Per-step table and a steady-state summary that leaves warm-up steps out.

Steps come from ``step N`` ranges (nvtx_autotrace's, or the user's own
``step 3``/``iteration 3``). Warm-up (cuDNN autotuning, allocator growth,
worker start-up) makes early steps many times slower; averaging them in would
blame the wrong thing, so they are reported but excluded from the summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import name_mask

# a step's parts, each a ``<part>_ns`` column and a ``<part>_fraction`` of step time; collective_wait (its GPU
# spinning inside collectives for a peer, no other kernel running: busy, but not work) only with paired ones
STEP_PARTS = ("gpu_busy", "loader_wait", "sync_wait", "collective_wait")
WARMUP_FACTOR = 1.5  # a leading step slower than this x the median of the rest is warm-up


@dataclass
class StepsResult:
    table: pd.DataFrame  # step, start_ns, end_ns, duration_ns, <part>_ns of STEP_PARTS measured, warmup
    source: str  # summary.json steps.source: "nvtx" (step ranges) or "inferred:<method>"
    warmup_steps: int
    pid: int  # the training process whose steps these are
    measured: tuple[str, ...] = ("gpu_busy", "loader_wait", "sync_wait")  # the rest is unknown, not zero
    how: str = "`step N` ranges"  # the same, in words
    confidence: float | None = None  # inferred steps: share of steady-state kernels that repeat at the period
    capture_first_step: int | None = None  # the step a capture window opened at, after warm-up (its record)
    program: str | None = None  # the script's file name, as the window's record gives it

    def extend_warmup(self, first_time_ns: np.ndarray, threshold_ns: int) -> None:
        """Leading steps that still load GPU code (``first_time_ns`` per step) are warm-up too, up to half."""
        k = self.warmup_steps
        while k < len(self.table) // 2 and first_time_ns[k] >= threshold_ns:
            k += 1
        if k > self.warmup_steps:
            self.warmup_steps = k
            self.table["warmup"] = np.arange(len(self.table)) < k

    @property
    def steady(self) -> pd.DataFrame:
        return self.table[~self.table["warmup"]]

    def steady_window(self) -> tuple[int, int] | None:
        s = self.steady
        return (int(s["start_ns"].min()), int(s["end_ns"].max())) if len(s) else None

    def summary(self) -> dict:
        s = self.steady
        if not len(s):
            return {}
        d = s["duration_ns"].to_numpy()
        modes = two_modes(d)
        return {
            "steps": int(len(self.table)),
            "warmup_steps": int(self.warmup_steps),
            "capture_first_step": self.capture_first_step,
            "steady_steps": int(len(s)),
            "step_ns_median": int(np.median(d)),
            "step_ns_mean": int(d.mean()),
            "step_ns_p90": int(np.percentile(d, 90)),
            "step_ns_std": int(d.std()),
            "modes": modes,
            "statistic": typical_statistic(float(np.median(d)), float(d.mean()), modes),
            **{f"{what}_fraction": _fraction(s[f"{what}_ns"].to_numpy(np.float64), d)
               if what in self.measured else None for what in STEP_PARTS},
        }


def _fraction(part_ns: np.ndarray, durations: np.ndarray) -> float | None:
    """Of the time of the steps where the part is known (NaN: unknown in that step); None where it never is."""
    known = ~np.isnan(part_ns)
    if not known.any():
        return None
    total = durations[known].sum()
    return float(part_ns[known].sum() / total) if total else 0.0


def two_modes(durations: np.ndarray, ratio: float = 2.5, min_share: float = 0.2, tight: float = 0.25) -> dict | None:
    """Steps of two kinds (a slow one every other step, a loader that keeps up only sometimes), split where
    the two groups of log-durations are furthest apart (Otsu). Two kinds only if each group holds
    >= ``min_share`` of the steps, their medians differ >= ``ratio`` x and at least one group is tight
    (interquartile range <= ``tight`` x its median): a wide spread with no cluster is not two kinds.
    A median then describes neither kind, so the summary names both and the mean."""
    d = np.sort(np.asarray(durations, dtype=np.float64))
    if len(d) < 4 or d[0] <= 0:
        return None
    logs = np.log(d)
    n, total = len(d), logs.sum()
    least = max(2, int(np.ceil(min_share * n)))
    ks = np.arange(least, n - least + 1)  # size of the low group
    if not len(ks):
        return None
    low_sum = np.cumsum(logs)[ks - 1]
    between = ks * (n - ks) * (low_sum / ks - (total - low_sum) / (n - ks)) ** 2
    k = int(ks[np.argmax(between)])
    low, high = d[:k], d[k:]

    def spread(x: np.ndarray) -> float:
        q1, q3 = np.percentile(x, [25, 75])
        return float((q3 - q1) / np.median(x))

    if np.median(high) < ratio * np.median(low) or min(spread(low), spread(high)) > tight:
        return None
    return {"low_ns": int(np.median(low)), "high_ns": int(np.median(high)), "low_steps": int(len(low)),
            "high_steps": int(len(high))}


UNEVEN_RATIO = 1.15  # a mean this far above the median: a few long steps (bursty waits) set the pace


def typical_statistic(median: float, mean: float, modes: dict | None) -> str:
    """``mean`` when steps come in two kinds, or are uneven (a few long ones: a loader delivering in bursts,
    a straggler): a median then lands on the short steps and hides what sets throughput; else ``median``."""
    return "mean" if modes or (median and mean >= UNEVEN_RATIO * median) else "median"


def typical_step_ns(summary: dict) -> tuple[int | None, str]:
    """The step time that sets throughput, and which statistic it is (``summary["statistic"]``)."""
    if not summary:
        return None, "median"
    stat = summary.get("statistic") or typical_statistic(summary.get("step_ns_median") or 0,
                                                         summary.get("step_ns_mean") or 0, summary.get("modes"))
    return summary.get(f"step_ns_{stat}"), stat


def find_step_ranges(ranges: pd.DataFrame, step_range: str | None = None) -> tuple[pd.DataFrame, str]:
    """The step ranges to use: those matching ``step_range`` when given, else nvtx_autotrace's when present,
    else the user's ``step N`` / ``iteration N``."""
    if not len(ranges):
        return ranges, ""
    if step_range is not None:
        rows, nested = _user_step_ranges(ranges, step_range)
        return rows, f"user ranges matching {step_range!r}" + (
            f"; {nested} matching range(s) nested inside them left out" if nested else "")
    cats = ranges["name"].cat.categories
    codes = ranges["name"].cat.codes.to_numpy()
    index = {c: names.STEP_RE.match(c) for c in cats}
    auto = np.array([bool(m) and c.startswith(names.STEP_PREFIX) and c == names.step(int(m.group(1)))
                     for c, m in index.items()], dtype=bool)
    any_step = np.array([bool(m) for m in index.values()], dtype=bool)
    for mask, source in ((auto, "`step N` ranges"), (any_step, "user step ranges (`step N`, `iteration N`)")):
        rows = ranges[mask[codes]] if len(cats) else ranges.iloc[:0]
        if len(rows):
            # One training thread: the one with the most step ranges.
            main = rows["gtid"].value_counts().idxmax()
            rows = rows[rows["gtid"] == main].sort_values("start_ns", ignore_index=True)
            rows = rows.assign(step=[int(index[str(n)].group(1)) for n in rows["name"]])
            return _drop_steps_without_optimizer(rows, ranges), source
    return ranges.iloc[:0], ""


def _user_step_ranges(ranges: pd.DataFrame, step_range: str) -> tuple[pd.DataFrame, int]:
    """Ranges whose name matches ``step_range``, on the thread that has most of them, numbered in time order,
    and how many were left out for lying inside another match: a pattern that also matches ranges within the
    steps (``step`` matches ``optimizer.step 3`` in ``step 3``) would otherwise cut each step into pieces."""
    pattern = re.compile(step_range)
    rows = ranges[name_mask(ranges["name"], lambda n: bool(pattern.search(n)))]
    if not len(rows):
        return rows, 0
    main = rows["gtid"].value_counts().idxmax()
    rows = rows[rows["gtid"] == main].sort_values(["start_ns", "end_ns"], ascending=[True, False], ignore_index=True)
    ends = rows["end_ns"].to_numpy()
    latest_end_before = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
    outermost = rows["start_ns"].to_numpy() >= latest_end_before
    rows = rows[outermost].reset_index(drop=True)
    return rows.assign(step=np.arange(len(rows))), int((~outermost).sum())


def _drop_steps_without_optimizer(steps: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """nvtx_autotrace opens ``step N+1`` when step N's optimizer ends, so the last one runs until exit
    (evaluation, teardown). A step with no ``optimizer.step`` of its own process inside, when others have
    one, is not training."""
    opt = ranges[name_mask(ranges["name"], lambda c: c.startswith(names.OPTIMIZER_STEP_PREFIX))
                 & (ranges["pid"].to_numpy() == steps["pid"].iloc[0])]  # not another rank's
    if not len(opt):
        return steps
    ends = np.sort(opt["end_ns"].to_numpy())
    has = np.searchsorted(ends, steps["end_ns"].to_numpy(), side="right") > \
        np.searchsorted(ends, steps["start_ns"].to_numpy(), side="left")
    return steps[has].reset_index(drop=True) if has.any() else steps


def analyze_steps(ranges: pd.DataFrame, busy_by_pid: dict[int, iv.Set] | None, loader_waits: pd.DataFrame | None,
                  sync_calls: pd.DataFrame | None, warmup_steps: int | None = None,
                  infer=None, step_range: str | None = None) -> StepsResult | None:
    """Per-step GPU busy time and waits, all of the training process (one rank of a DDP job).

    None for an input means it was not captured: its fraction is reported as unknown, not as zero.
    Without step ranges, ``infer()`` (infer_steps.InferredSteps or None) may find the steps.
    """
    steps, how = find_step_ranges(ranges, step_range)
    source, confidence = ("nvtx" if step_range is None else f"user:{step_range}"), None
    if not len(steps) and infer is not None:
        found = infer()
        if found is not None:
            steps, source, confidence = found.steps, found.method, found.confidence
            how = (f"inferred from the kernel sequence, which repeats every {found.period_kernels} kernels, "
                   f"{found.confidence:.0%} of the steady state's") if not found.marker else \
                (f"inferred from the range `{found.marker}`, which " + ("marks each iteration"
                 if found.marker.startswith(names.OPTIMIZER_STEP_PREFIX) else "recurs evenly (each may be a "
                 "micro-batch: name the real step ranges with --step-range)"))
    if not len(steps):
        return None
    start = steps["start_ns"].to_numpy()
    end = steps["end_ns"].to_numpy()
    pid = int(steps["pid"].iloc[0])
    loader_wait, sync_wait = (union_of_process(df, pid) for df in (loader_waits, sync_calls))
    table = pd.DataFrame({"step": steps["step"].to_numpy(), "start_ns": start, "end_ns": end,
                          "duration_ns": end - start})
    table["gpu_busy_ns"] = iv.Coverage((busy_by_pid or {}).get(pid, iv.empty())).measure(start, end)
    table["loader_wait_ns"] = iv.Coverage(loader_wait).measure(start, end)
    table["sync_wait_ns"] = iv.Coverage(sync_wait).measure(start, end)
    settled = _before_instrumentation_settled(ranges, pid, start)  # also under a capture window's own warm-up
    if warmup_steps is None:
        n_warm = max(detect_warmup(table["duration_ns"].to_numpy(), first_is_warmup=source == "nvtx"), settled)
    else:
        n_warm = max(min(warmup_steps, len(table)), settled)
    table["warmup"] = np.arange(len(table)) < n_warm
    measured = tuple(what for what, given in (("gpu_busy", busy_by_pid), ("loader_wait", loader_waits),
                                              ("sync_wait", sync_calls)) if given is not None)
    return StepsResult(table=table, source=source, warmup_steps=n_warm, pid=pid, measured=measured, how=how,
                       confidence=confidence)


def _before_instrumentation_settled(ranges: pd.DataFrame, pid: int, step_starts: np.ndarray) -> int:
    """Steps that began before nvtx_autotrace chose its module ranges (they ran with other ranges, and its
    calibration sits between two of them): warm-up, unless that would leave no step."""
    hit = name_mask(ranges["name"], lambda n: n.startswith(names.INSTRUMENTATION_PREFIX)) \
        & (ranges["pid"].to_numpy() == pid)
    if not hit.any():
        return 0
    settled = int(ranges["end_ns"].to_numpy()[hit].max())
    return min(int((step_starts < settled).sum()), len(step_starts) - 1)


def union_of_process(intervals: pd.DataFrame | None, pid: int) -> iv.Set:
    """Union of one process's intervals (a DDP rank's waits, not every rank's)."""
    if intervals is None or not len(intervals):
        return iv.empty()
    mine = intervals[intervals["pid"] == pid]
    return iv.union(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())


def detect_warmup(durations: np.ndarray, first_is_warmup: bool = True) -> int:
    """The first step, plus the steps right after it that are still much slower than the typical one.

    Inferred steps begin where the rhythm does, after the start-up: their first step is warm-up only
    when it is slow too (``first_is_warmup=False``)."""
    n = len(durations)
    if n < 3:
        return 0
    typical = np.median(durations[1:])
    k = 1 if first_is_warmup else 0
    while k < n // 2 and durations[k] > WARMUP_FACTOR * typical:
        k += 1
    return k
