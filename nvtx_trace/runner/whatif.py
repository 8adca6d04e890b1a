"""What-if runs (``nvtx-trace try``): the program as it is and with knobs applied, timed without a profiler.

Each run is ``python -m nvtx_autotrace SCRIPT ARGS`` with no profiler attached, so nvtx_autotrace keeps only
its step counter (a few µs a step) and the knobs; the default window (auto_window, mode ``time``) skips the
warm-up until the pace settles, times the steps that follow at the step boundaries the counter already
marks (no sync added), and stops the program. Baseline and variants alternate (A B B A ...) so drift on a
shared machine falls on both. A step time is the median of a round's steps, or the mean when they are
uneven (the rule ``diff`` uses); a variant's step is the median of its rounds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_trace import names
from nvtx_trace.analyzer.steps import typical_statistic
from nvtx_trace.errors import NvtxTraceError
from nvtx_trace.runner import default_window

KNOB_LINE = "nvtx-trace try: "
RUN_TIMEOUT_S = 900  # one run: start-up and compilation, warm-up (at most 30 s once steps run), the window
LOSSES = 5  # steps whose loss is compared with the baseline's (warm-up steps: read once, before any timed step)


@dataclass
class Round:
    step_ms: list[float]  # the timed window's steps
    statistic: str  # median or mean (uneven steps)
    value_ms: float | None
    lines: list[str]  # what the knobs said they changed
    returncode: int
    why: str = ""  # why there is no value
    losses: list[float | None] = field(default_factory=list)  # the first steps' losses (LOSSES steps)


@dataclass
class Variant:
    knobs: dict
    rounds: list[Round] = field(default_factory=list)

    @property
    def label(self) -> str:
        return names.knobs_text(self.knobs) or "baseline"

    @property
    def step_ms(self) -> float | None:
        values = [r.value_ms for r in self.rounds if r.value_ms is not None]
        return statistics.median(values) if values else None


def time_once(target: list[str], knobs: dict, python: str | None = None, cwd: Path | None = None,
              timeout: float | None = None) -> Round:
    """One run of the program, timed in the default window, with ``knobs`` applied."""
    with tempfile.TemporaryDirectory(prefix="nvtx-trace-try-") as tmp:
        window = Path(tmp) / "window.jsonl"
        env = dict(os.environ)
        for key in (names.CAPTURE_ENV, names.TRY_ENV):
            env.pop(key, None)
        env.update({names.AUTO_WINDOW_ENV: "time:exit", names.WINDOW_FILE_ENV: str(window),
                    names.AUTOTRACE_ENV: "auto", names.LOSSES_ENV: str(LOSSES), "PYTHONUNBUFFERED": "1"})
        if knobs:
            env[names.TRY_ENV] = names.knobs_text(knobs)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = [python or sys.executable, "-m", "nvtx_autotrace", *target]
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            return Round([], "median", None, [], -1, f"the run was stopped after {timeout:.0f} s (the default "
                                                     "window takes at most about two minutes after start-up)")
        lines = [ln[len(KNOB_LINE):] for ln in proc.stderr.splitlines() if ln.startswith(KNOB_LINE)]
        events = default_window.events(window)
    steps = next((e.get("step_ms") for e in reversed(events) if e.get("step_ms")), None)
    losses = next((e.get("values") or [] for e in events if e.get("event") == "losses"), [])
    if not steps:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        why = ("the program ended before its pace settled" if proc.returncode == 0 else
               f"the program exited with status {proc.returncode}: {tail[0][:200]}")
        return Round([], "median", None, lines, proc.returncode, why, losses)
    median, mean = statistics.median(steps), statistics.fmean(steps)
    stat = typical_statistic(median, mean, None)
    return Round(steps, stat, median if stat == "median" else mean, lines, proc.returncode, "", losses)


def loss_difference(base: list, other: list) -> float | None:
    """The largest relative difference between two runs' losses over the steps both recorded."""
    pairs = [(a, b) for a, b in zip(base, other) if a is not None and b is not None and a == a and b == b]
    if not pairs:
        return None
    return max(abs(b - a) / max(abs(a), 1e-12) for a, b in pairs)


def compare(target: list[str], knob_sets: list[dict], rounds: int = 2, python: str | None = None,
            progress=None) -> list[Variant]:
    """The baseline and each knob set, ``rounds`` times each, alternating; the baseline first in the list."""
    variants = [Variant({}), *(Variant(k) for k in knob_sets)]
    for r in range(rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for v in order:
            if progress:
                progress(f"round {r + 1}/{rounds}: {v.label}")
            v.rounds.append(time_once(target, v.knobs, python, timeout=RUN_TIMEOUT_S))
        base = variants[0]
        if not base.rounds[-1].step_ms:
            raise NvtxTraceError(f"the baseline run gave no step times: {base.rounds[-1].why}; nvtx-trace try needs "
                                 "a training loop that calls optimizer.step() (or nvtx_autotrace.mark_step()) for "
                                 "at least ~30 steps")
    return variants
