"""Open an Nsight Systems SQLite export safely: the one place that decides "is this a usable export?".

Kept free of pandas/numpy so every command (redact, doctor, analyze) can use it cheaply.
Opening is read-only and ``immutable``: no locks, no journal, no way to change the input.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nvtx_trace.errors import BadReportError

SQLITE_MAGIC = b"SQLite format 3\x00"
EXPORT_MARKERS = {"EXPORT_META_DATA", "META_DATA_EXPORT", "TARGET_INFO_SYSTEM_ENV", "ANALYSIS_DETAILS"}


def _fail(path: Path, problem: str, todo: str) -> BadReportError:
    return BadReportError(f"{path}: {problem}; {todo}")


def open_export(path) -> tuple[sqlite3.Connection, set[str]]:
    """Checked read-only connection and the export's table names; BadReportError with one clear line otherwise."""
    path = Path(path)
    if not path.exists():
        raise _fail(path, "no such file", "check the path")
    if path.is_dir():
        raise _fail(path, "is a directory, not a report", "pass the .sqlite (or .nsys-rep) file inside it")
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror})", "check its permissions") from None
    if not head:
        raise _fail(path, "is empty", "re-export it with: nsys export --type sqlite REPORT.nsys-rep")
    if not head.startswith(SQLITE_MAGIC):
        raise _fail(path, "is not a SQLite file", "pass an Nsight Systems SQLite export (nsys export --type sqlite)")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True, check_same_thread=False)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise _fail(path, f"is damaged ({exc})", "it was probably truncated; export it again") from None
    if "StringIds" not in tables or not tables & EXPORT_MARKERS:
        conn.close()
        raise _fail(path, "is a SQLite database but not an Nsight Systems export",
                    "pass a file written by: nsys export --type sqlite")
    return conn, tables
