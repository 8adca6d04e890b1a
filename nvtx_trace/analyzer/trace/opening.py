"""Open an Nsight Systems SQLite export safely: the one place that decides "is this a usable export?".

Kept free of pandas/numpy so every command (redact, doctor, analyze) can use it cheaply.
Opening is read-only and ``immutable``: no locks, no journal, no way to change the input. A
WAL-mode database with pages still in its ``-wal`` file is merged in a private temporary copy.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from nvtx_trace.errors import BadReportError
from nvtx_trace.files import describe_unreadable

SQLITE_MAGIC = b"SQLite format 3\x00"
EXPORT_MARKERS = {"EXPORT_META_DATA", "META_DATA_EXPORT", "TARGET_INFO_SYSTEM_ENV", "ANALYSIS_DETAILS"}


def _fail(path: Path, problem: str, todo: str) -> BadReportError:
    return BadReportError(f"{path}: {problem}; {todo}")


def _merged_copy(path: Path, wal: Path) -> Path:
    """A private copy of a WAL-mode database with its ``-wal`` pages checkpointed in.

    An ``immutable`` open ignores the WAL (and would miss every page still in it), and a normal
    read-only open may write a ``-shm`` file beside the input; so the two files are copied to a
    temporary folder and merged there. Nothing is ever written next to the input.
    """
    tmp = Path(tempfile.mkdtemp(prefix="nvtx-trace-wal-"))
    try:
        copy = tmp / path.name
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, Path(str(copy) + "-wal"))
        merge = sqlite3.connect(copy)
        try:
            merge.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            merge.execute("PRAGMA journal_mode=DELETE")
        finally:
            merge.close()
    except (OSError, sqlite3.DatabaseError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _fail(path, f"is in WAL mode and its -wal pages cannot be merged ({exc})",
                    "check free space in the temporary folder, or checkpoint it with sqlite3") from None
    return copy


def open_export(path) -> tuple[sqlite3.Connection, set[str]]:
    """Checked read-only connection and the export's table names; BadReportError with one clear line otherwise."""
    path = Path(path)
    if not path.exists():
        problem = describe_unreadable(path)
        raise _fail(path, problem or "no such file", "pass the report file itself" if problem else "check the path")
    if path.is_dir():
        raise _fail(path, "is a directory, not a report", "pass the .sqlite (or .nsys-rep) file inside it")
    if not path.is_file():  # a FIFO or a device: reading it could block forever or never end
        raise _fail(path, "is not a regular file", "pass the .sqlite export itself")
    try:
        with open(path, "rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        raise _fail(path, f"cannot be read ({exc.strerror})", "check its permissions") from None
    if not head:
        raise _fail(path, "is empty", "re-export it with: nsys export --type sqlite REPORT.nsys-rep")
    if not head.startswith(SQLITE_MAGIC):
        raise _fail(path, "is not a SQLite file", "pass an Nsight Systems SQLite export (nsys export --type sqlite)")
    wal = Path(str(path) + "-wal")
    source = _merged_copy(path, wal) if wal.is_file() and wal.stat().st_size > 0 else path
    try:
        conn = sqlite3.connect(source.resolve().as_uri() + "?mode=ro&immutable=1", uri=True, check_same_thread=False)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise _fail(path, f"is damaged ({exc})", "it was probably truncated; export it again") from None
    finally:
        if source != path:  # the open connection keeps the merged copy's data; its name can go at once
            shutil.rmtree(source.parent, ignore_errors=True)
    if "StringIds" not in tables or not tables & EXPORT_MARKERS:
        conn.close()
        raise _fail(path, "is a SQLite database but not an Nsight Systems export",
                    "pass a file written by: nsys export --type sqlite")
    return conn, tables
