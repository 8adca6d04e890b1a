"""Checks of the analysis options, shared by ``analyze`` and ``run`` (which checks before profiling,
not after minutes of it). Kept free of pandas so ``run`` stays quick to start."""

from __future__ import annotations

import math
import re

from nvtx_trace.errors import UsageError

MAX_GAP_MS = 86_400_000.0  # one day: larger gaps mean nothing, and overflow int64 nanosecond arithmetic


def check_analysis_options(min_gap_ms: float = 1.0, loader_pattern: str | None = None,
                           warmup_steps: int | None = None, step_range: str | None = None) -> None:
    if not math.isfinite(min_gap_ms) or not 0 <= min_gap_ms <= MAX_GAP_MS:
        raise UsageError(f"--min-gap-ms must be a number from 0 to {MAX_GAP_MS:.0f} (one day) (got {min_gap_ms}); "
                         "example: --min-gap-ms 0.5")
    _check_regex("--loader-pattern", loader_pattern, "'^data'")
    _check_regex("--step-range", step_range, "'^train_step$'")
    if warmup_steps is not None and warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0 (got {warmup_steps})")


def _check_regex(option: str, value: str | None, example: str) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as exc:
        raise UsageError(f"{option} {value!r} is not a valid regular expression ({exc}); "
                         f"example: {option} {example}") from None
