"""Where are the training steps, and what does a steady step spend its time on?"""

from __future__ import annotations

import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.findings import ms, pct
from nvtx_trace.analyzer.measures.instrumentation_cost import read_record
from nvtx_trace.analyzer.measures.startup_time import FIRST_TIME_NS, first_time_code_ns
from nvtx_trace.analyzer.measures.step_rhythm import infer_from_ranges, infer_steps
from nvtx_trace.analyzer.measures.step_times import STEP_PARTS, analyze_steps
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.errors import UsageError


def _run(ctx: Context) -> None:
    a = ctx.result
    busy_by_pid: dict[int, iv.Set] = {}
    for dev in a.idle.devices if a.idle else []:
        for pid in dev.pids:
            busy_by_pid[pid] = iv.merge(busy_by_pid.get(pid, iv.empty()), dev.busy)
    infer = None if ctx.step_range else (lambda: _infer(ctx.trace))
    # A capture window nvtx_autotrace opened after warm-up says so in the report: every door then leaves no
    # further step out, as `run` (which saw the window open) does.
    opened = read_record(ctx.trace.ranges, names.WINDOW_PREFIX) if len(ctx.trace.ranges) else None
    first = opened.get("first_step") if opened else None
    first = first if isinstance(first, int) and not isinstance(first, bool) else None
    warmup = 0 if ctx.warmup_steps is None and first is not None else ctx.warmup_steps
    a.steps = analyze_steps(ctx.trace.ranges, busy_by_pid if a.idle else None, a.loader.waits if a.loader else None,
                            a.sync.calls if a.sync else None, warmup, infer=infer,
                            step_range=ctx.step_range)
    if a.steps is not None:
        a.steps.capture_first_step = first
        program = (opened or {}).get("program")
        a.steps.program = program if isinstance(program, str) and program else None
    if a.steps is not None and warmup is None:
        t = a.steps.table
        a.steps.extend_warmup(first_time_code_ns(ctx.trace, t["start_ns"].to_numpy(), t["end_ns"].to_numpy()),
                              FIRST_TIME_NS)
    if a.steps is None and ctx.step_range is not None:
        raise UsageError(f"--step-range {ctx.step_range!r} matches no NVTX range in {ctx.trace.info.path} ("
                         f"{_range_names(ctx.trace.ranges)}); give a regex of your step ranges' name")
    if a.steps is not None and ctx.warmup_steps is not None and ctx.warmup_steps >= len(a.steps.table):
        raise UsageError(f"--warmup-steps {ctx.warmup_steps} leaves no steady step: {ctx.trace.info.path} holds "
                         f"{len(a.steps.table)} step(s) ({a.steps.how}); give fewer, or leave it out to detect them")
    if a.steps is None:
        a.skipped["steps"] = ("no step ranges (`step N` from nvtx_autotrace, or user ranges like `step 3`), and the "
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


def _json(a) -> dict:
    if not a.steps:
        return {"steps": None}
    table = a.steps.table.astype(object)
    for what in STEP_PARTS:
        if what not in a.steps.measured:  # not captured: unknown, not zero
            table[f"{what}_ns"] = None
        else:  # nanoseconds are whole; NaN (unknown in that step) is null
            table[f"{what}_ns"] = [None if pd.isna(v) else int(v) for v in table[f"{what}_ns"]]
    return {"steps": {"source": a.steps.source, "how": a.steps.how, "confidence": a.steps.confidence,
                      "summary": a.steps.summary(), "table": table}}


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


def _text(a, view) -> None:
    s = a.steps.summary() if a.steps else {}
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
        f"Steps ({a.steps.how}): {s['steps']}, {s['warmup_steps']} of them warm-up; steady state {pace}. "
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
    tables=lambda a: {"steps": a.steps.table} if a.steps else {},
    text=_text, text_at=50,
)
