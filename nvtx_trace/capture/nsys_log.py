"""nsys's own output ("Generated: ...", "Importer error status", progress bars) kept out of the terminal.

Why: on every run nsys prints lines that mean nothing to the user, and some that mislead
(a ``.qdstrm`` it names is deleted later; an importer error we recover from). They go to a
log file in the run's folder, and only its last lines are shown, when a step fails.
"""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path
from typing import IO, Sequence

from nvtx_trace.errors import NsysFailedError

LOG_NAME = "nsys.log"


def run_quiet(argv: Sequence[str], timeout: float | None = 60, **kw) -> subprocess.CompletedProcess:
    """Run a command with no stdin and its output captured as text."""
    return subprocess.run(
        list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        errors="replace", timeout=timeout, **kw,
    )


def run_step(step: str, argv: Sequence[str], log: "NsysLog | None", cannot: str) -> tuple[int, str]:
    """One nsys step (import, export) to its end: (exit status, its output), the output kept in the log.
    A program that cannot start is one error line: ``cannot`` + why."""
    try:
        proc = run_quiet(argv, timeout=None)
    except OSError as exc:
        raise NsysFailedError(cannot.format(why=exc)) from exc
    output = proc.stdout + proc.stderr
    if log is not None:
        log.add(step, argv, output)
    return proc.returncode, output


def tail(text: str, lines: int = 3) -> str:
    """The last non-blank lines of some output, on one line (progress bars' carriage returns split lines)."""
    kept = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return " / ".join(kept[-lines:])


class NsysLog:
    """``nsys.log`` in the run's folder: each nsys step's output under a ``== nsys <step> ==`` header."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def section(self, step: str, argv: Sequence[str] = ()) -> None:
        self.write(_header(step, argv) + "\n")

    def write(self, text: str) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8", errors="replace") as fh:
            fh.write(text)

    def add(self, step: str, argv: Sequence[str], output: str) -> None:
        """One finished step's output, each progress bar reduced to its last state."""
        kept = _last_of_each_bar(output.replace("\r", "\n").splitlines())
        self.write("\n".join([_header(step, argv), *kept]) + "\n")  # in one write: steps may run side by side

    def tail(self, lines: int = 3) -> str:
        try:
            return tail(self.path.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def last_words(self) -> str:
        """What the latest step said (its output after its ``== nsys`` header and command line)."""
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return ""
        at = text.rfind("== nsys ")
        return text[at:].partition("\n")[2] if at >= 0 else text

    def where(self) -> str:
        """How failure messages point at the whole log."""
        return f"nsys's output is in {self.path}"


def _header(step: str, argv: Sequence[str]) -> str:
    return f"== nsys {step} ==" + (f" {' '.join(map(str, argv))}" if argv else "")


_BAR = re.compile(r"^(?P<label>.*?)\[[= ]*\d+%[= ]*\](?P<after>.*?)\s*$")  # "[1/1] [==18%  ] report.nsys-rep"


def bar_label(line: str) -> str | None:
    """What a progress bar line is about (its text around the bar), or None for any other line."""
    m = _BAR.match(line)
    return None if m is None else m["label"] + "|" + m["after"]


def _last_of_each_bar(lines: list[str]) -> list[str]:
    """Drop blank lines and every state of a progress bar but the last ("Exporting 120 events: [..100%]")."""
    kept: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        bar = bar_label(line)
        if bar is not None and kept and bar_label(kept[-1]) == bar:
            kept[-1] = line
        else:
            kept.append(line)
    return kept


def pump(stream: IO[str], sink) -> threading.Thread:
    """Copy a pipe line by line into ``sink(line)`` on a daemon thread until it closes."""

    def copy() -> None:
        for line in iter(stream.readline, ""):
            sink(line)
        stream.close()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
