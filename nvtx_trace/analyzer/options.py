"""The analysis options, checked and converted once: the CLI (``analyze``, ``run`` before it profiles) and
notebooks all build one ``AnalysisOptions`` with ``parse_options``. Free of pandas, so ``run`` starts quickly."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nvtx_trace import names
from nvtx_trace.errors import UsageError

MAX_GAP_MS = 86_400_000.0  # one day: larger gaps mean nothing, and overflow int64 nanosecond arithmetic


@dataclass(frozen=True)
class AnalysisOptions:
    min_gap_ns: int = 1_000_000  # the smallest GPU idle gap counted
    loader_pattern: str = names.DEFAULT_USER_LOADER_PATTERN  # the user's own data-loader ranges
    warmup_steps: int | None = None  # None: found from the step pace
    step_range: str | None = None  # the user's own ranges that are the steps
    scheduler: str | None = None  # several reports: a Dask scheduler (tcp://HOST:PORT or local:N)
    workers: int | None = None  # several reports: local worker processes


def parse_options(min_gap_ms: float = 1.0, loader_pattern: str | None = None, warmup_steps: int | None = None,
                  step_range: str | None = None, scheduler: str | None = None,
                  workers: int | None = None) -> AnalysisOptions:
    """Options from their command-line forms; one line (UsageError) for the first that is wrong."""
    if not math.isfinite(min_gap_ms) or not 0 <= min_gap_ms <= MAX_GAP_MS:
        raise UsageError(f"--min-gap-ms must be a number from 0 to {MAX_GAP_MS:.0f} (one day) (got {min_gap_ms}); "
                         "example: --min-gap-ms 0.5")
    _check_regex("--loader-pattern", loader_pattern, "'^data'")
    _check_regex("--step-range", step_range, "'^train_step$'")
    if warmup_steps is not None and warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0 (got {warmup_steps})")
    _check_scheduler(scheduler, workers)
    return AnalysisOptions(min_gap_ns=int(round(min_gap_ms * 1e6)),
                           loader_pattern=loader_pattern or names.DEFAULT_USER_LOADER_PATTERN,
                           warmup_steps=warmup_steps, step_range=step_range, scheduler=scheduler, workers=workers)


def _check_regex(option: str, value: str | None, example: str) -> None:
    if value is None:
        return
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise UsageError(f"{option} {value!r} is not a valid regular expression ({exc}); "
                         f"example: {option} {example}") from None
    if pattern.search(""):  # '', '.*', 'a?': every range name would match
        raise UsageError(f"{option} {value!r} matches the empty text, so every range; give a regex of the ranges' "
                         f"names, e.g. {option} {example}")


def _check_scheduler(scheduler: str | None, workers: int | None) -> None:
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {workers})")
    if scheduler is None:
        return
    if scheduler.startswith("local:"):
        n = scheduler.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"--scheduler {scheduler!r}: local:N needs a number of workers >= 1, e.g. local:4")
    else:
        host, _, port = scheduler.split("://", 1)[-1].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--scheduler {scheduler!r}: give a Dask scheduler address (tcp://HOST:PORT) or local:N")
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise UsageError("--scheduler needs Dask: python3 -m pip install 'nvtx-trace[dask]' "
                         "(or leave --scheduler out for a local process pool)") from None
