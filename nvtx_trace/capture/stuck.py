"""Has nsys stopped finishing its report? The program has ended, nsys still runs, and nothing it writes grows.

Why: nsys 2022.4 (Debian's) can never return after the program ends: its agent spins at 100 % of a core on
the hang-up of its perf-event descriptors (CPU sampling, context switches; strace: ``epoll_wait`` returning
EPOLLHUP on them, for ever) and the raw capture in the temporary folder stops growing. With sampling on and a
busy CPU beside it, every one-second program hung (4 of 4 on the 2-core VM); ``run`` turns sampling off, so this
is left for ``--nsys-args`` that turn it on, and for whatever else hangs an nsys. Without a limit ``run`` waits
for ever, and the spinning agent slows whatever runs next. Progress is
read from the files nsys writes (the report's own and its temporary ``nsys-report-*.qdstrm``), not from its
CPU time: the stuck agent burns CPU too.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from nvtx_trace.capture.interrupts import env_seconds

STALL_ENV = "NVTX_TRACE_NSYS_STALL_S"
DEFAULT_STALL_S = 300.0  # a big capture's import writes all along; 5 minutes of nothing is not finishing
NOTE_EVERY_S = 30.0
LOOK_EVERY_S = 5.0  # each look reads /proc


def stall_s() -> float:
    """``$NVTX_TRACE_NSYS_STALL_S`` (seconds, > 0), else DEFAULT_STALL_S."""
    return env_seconds(STALL_ENV, DEFAULT_STALL_S, zero_allowed=False)


class Finishing:
    """Fed by the loop that waits for nsys (``look``): True once nsys has made no progress for ``stall_s()``
    with no program left running. ``program``: what nsys started that still runs, its importer included;
    ``stem``: the report's path without suffix; ``since``: when nsys started (wall clock: older temporary
    files are not ours)."""

    def __init__(self, program: Callable[[], list[int]], stem: Path, since: float,
                 notice: Callable[[str], None] | None = None, armed: Callable[[], bool] = lambda: True,
                 tmp: str | None = None):
        self.program, self.stem, self.since, self.notice, self.armed = program, stem, since, notice, armed
        self.tmp = tmp  # nsys's own TMPDIR, where it is not ours (profile's private folder)
        self.limit = stall_s()
        self.ended_at: float | None = None  # when no program was found running any more
        self.changed_at = time.monotonic()
        self.written: dict[str, int] = {}
        self.next_look = 0.0
        self.noted = 0
        self.stuck_for: float | None = None

    def look(self) -> bool:
        now = time.monotonic()
        if now < self.next_look:
            return False
        running = self.program()
        # at most 5 % of a core where reading /proc is slow (a busy GPU node), about 0.1 % here
        self.next_look = now + max(LOOK_EVERY_S, 20 * (time.monotonic() - now))
        if running or not self.armed():  # (under a launcher: no rank has started yet, e.g. a slow rendezvous)
            self.ended_at = None
            return False
        if self.ended_at is None:
            self.ended_at = now
        written = self._written()
        if written != self.written:
            self.written, self.changed_at = written, now
        quiet = now - max(self.ended_at, self.changed_at)
        if quiet >= self.limit:
            self.stuck_for = quiet
            return True
        waited = now - self.ended_at
        if self.notice and waited >= NOTE_EVERY_S * (self.noted + 1):
            self.noted = int(waited // NOTE_EVERY_S)
            self._say(f"nsys is still finishing the report, {waited:.0f} s after the program ended"
                      + (f" (nothing written for {quiet:.0f} s; it is ended at {self.limit:.0f} s)"
                         if quiet >= NOTE_EVERY_S else ""))
        return False

    def _written(self) -> dict[str, int]:
        """Sizes of the files nsys writes: the report's (every rank's) and its temporary raw captures."""
        found: dict[str, int] = {}
        prefix = self.stem.name.split("%", 1)[0]
        places = [(self.stem.parent, f"{prefix}*")]
        for tmp in {self.tmp or os.environ.get("TMPDIR") or "/tmp", "/tmp"}:
            places.append((Path(tmp), "nsys-report-*"))
        for folder, pattern in places:
            try:
                for path in folder.glob(pattern):
                    st = path.stat()
                    if st.st_mtime >= self.since - 1:
                        found[str(path)] = st.st_size
            except OSError:
                continue
        return found

    def _say(self, message: str) -> None:
        try:
            self.notice(message)
        except (RuntimeError, OSError, ValueError):
            pass

    def leftovers(self) -> list[Path]:
        """nsys's temporary raw captures that stayed unchanged for the whole limit: the stuck nsys's (a
        healthy run's, beside it, kept growing), halfway and useless (QdstrmImporter refuses them)."""
        return [Path(name) for name in self.written if Path(name).name.startswith("nsys-report-")]

    def problem(self, ranks: bool = False) -> str:
        what = ("an nsys of a rank made no progress" if ranks else "nsys made no progress")
        after = "its program ended" if ranks else "the program ended"
        kept = "" if ranks else ": no report was written"
        return (f"{what} for {self.stuck_for:.0f} s after {after} (nothing written; {STALL_ENV} sets the limit) "
                f"and was ended with its agent{kept}. Run again (nsys 2022.4 hangs so after short programs when it "
                "samples the CPUs, -s cpu or --cpuctxsw, on a busy machine)")
