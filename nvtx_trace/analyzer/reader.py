"""The only code that knows the Nsight Systems SQLite schema and how it differs across versions.

It opens exports read-only, checks they are exports at all, and hands out plain
numpy columns (integer nanoseconds, integer ids). Bulk columns come through
``group_concat`` + ``np.fromstring``: the rows never become Python objects,
which is ~3x faster than ``fetchall`` and what lets million-kernel reports load
in seconds. Branch on tables and columns that exist, never on version numbers.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nvtx_trace.errors import BadReportError
from nvtx_trace.export_file import open_export

RANGE_EVENT_TYPES = (59, 60, 70, 71)  # push/pop, start/end, and their NVTXT imports
GPU_OP_TABLES = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
}
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"

# Used only when an export has no ENUM_* tables (pre-2022 schemas).
FALLBACK_MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
FALLBACK_MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 7: "Unknown"}


@dataclass
class ReportInfo:
    path: Path
    nsys_version: str | None
    schema_version: str | None
    tables: set[str] = field(default_factory=set)
    capture_event_types: set[str] | None = None  # None: the export does not record them (2022.4)
    session: tuple[int, int] | None = None  # ANALYSIS_DETAILS startTime/stopTime (see Trace.session for its base)


def open_report(path: Path) -> tuple[sqlite3.Connection, ReportInfo]:
    """Open an export for reading only (checks in nvtx_trace.export_file) and read its metadata."""
    conn, tables = open_export(path)
    conn.execute("PRAGMA cache_size=-65536")
    info = ReportInfo(path=Path(path), nsys_version=None, schema_version=None, tables=tables)
    _read_metadata(conn, info)
    return conn, info


def _read_metadata(conn: sqlite3.Connection, info: ReportInfo) -> None:
    meta = {}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in info.tables:
            meta.update(dict(conn.execute(f"SELECT name, value FROM {table}").fetchall()))
    info.nsys_version = meta.get("EXPORT_PRODUCT_VERSION")
    info.schema_version = meta.get("EXPORT_SCHEMA_VERSION")
    if "ANALYSIS_DETAILS" in info.tables:
        try:
            row = conn.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row and all(isinstance(v, int) for v in row) and 0 <= row[0] < row[1]:
            info.session = (int(row[0]), int(row[1]))
    if "META_DATA_CAPTURE" in info.tables:
        info.capture_event_types = {
            v for (v,) in conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE'")
        }


class Reader:
    """Typed, version-independent access to one export."""

    def __init__(self, path: Path):
        self.conn, self.info = open_report(Path(path))
        self._columns: dict[str, set[str]] = {}
        self._strings: dict[int, str] = {}

    def close(self) -> None:
        self.conn.close()

    # ---- schema probing -----------------------------------------------------
    def has(self, table: str, column: str | None = None) -> bool:
        if table not in self.info.tables:
            return False
        if column is None:
            return True
        if table not in self._columns:
            self._columns[table] = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
        return column in self._columns[table]

    # ---- bulk columns -------------------------------------------------------
    def columns(self, select: dict[str, str], source: str, params=()) -> dict[str, np.ndarray]:
        """Integer columns of ``SELECT <exprs> FROM <source>`` as int64 arrays, row-aligned; NULL reads as -1.

        group_concat skips NULLs, so every expression is wrapped in IFNULL: one NULL would
        otherwise shift a column against the others.
        """
        inner = ", ".join(f"IFNULL({expr}, -1) AS c{i}" for i, expr in enumerate(select.values()))
        outer = ", ".join(f"group_concat(c{i})" for i in range(len(select)))
        texts = list(self.conn.execute(f"SELECT {outer} FROM (SELECT {inner} FROM {source})", params).fetchone())
        out = {}
        try:
            for i, key in enumerate(select):  # parse and free one text at a time: they are the memory peak
                out[key] = np.fromstring(texts[i], dtype=np.int64, sep=",") if texts[i] else np.empty(0, np.int64)
                texts[i] = None
        except ValueError:
            out = {}
        if len({len(v) for v in out.values()}) != 1:  # a non-integer value (text, real) in a column
            raise BadReportError(f"{self.info.path}: non-integer values in {source.split()[0]} "
                                 f"({', '.join(select.values())}); export the report again with nsys")
        return out

    def table_columns(self, select: dict[str, str], table: str, chunk_rows: int = 1_000_000) -> dict[str, np.ndarray]:
        """``columns`` over a whole table, read in rowid slices so the text never holds more than
        ``chunk_rows`` rows (a 5M-kernel table is ~400 MB of text in one piece)."""
        first, last = self.conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
        if first is None:
            return {key: np.empty(0, np.int64) for key in select}
        parts = [self.columns(select, f"{table} WHERE rowid >= ? AND rowid < ?", (lo, lo + chunk_rows))
                 for lo in range(int(first), int(last) + 1, chunk_rows)]
        out = {}
        for key in select:
            out[key] = np.concatenate([p.pop(key) for p in parts])
        return out

    def strings(self, ids) -> dict[int, str]:
        """StringIds values for the given ids, cached (names are looked up many times)."""
        want = {int(i) for i in ids if int(i) not in self._strings and int(i) >= 0}
        want_list = sorted(want)
        for i in range(0, len(want_list), 900):
            chunk = want_list[i:i + 900]
            q = f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))})"
            self._strings.update(self.conn.execute(q, chunk).fetchall())
        return {int(i): self._strings.get(int(i), f"<string {int(i)}>") for i in ids}

    def string_ids(self, like_any: tuple[str, ...], pattern) -> list[int]:
        """Ids of the strings matching ``pattern``; ``like_any`` (SQL LIKE, one must match) narrows the
        scan first so the regex runs on a handful of strings, not on every kernel and range name."""
        where = " OR ".join("value LIKE ?" for _ in like_any)
        rows = self.conn.execute(f"SELECT id, value FROM StringIds WHERE {where}", like_any).fetchall()
        return sorted(int(i) for i, v in rows if pattern.search(v))

    # ---- enums ---------------------------------------------------------------
    def enum(self, table: str, fallback: dict[int, str]) -> dict[int, str]:
        """Enum id -> label; the report's own ENUM_* table wins (its numbering is not CUPTI's)."""
        if self.has(table):
            cols = self._columns.setdefault(table, {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")})
            label = "label" if "label" in cols else "name"
            return {int(i): str(v) for i, v in self.conn.execute(f"SELECT id, {label} FROM {table}")}
        return dict(fallback)

    def enum_id(self, table: str, fallback: dict[int, str], *labels: str) -> int | None:
        wanted = {lab.lower() for lab in labels}
        for i, lab in self.enum(table, fallback).items():
            if lab.lower() in wanted:
                return i
        return None

    def htod_copy_kind(self) -> int | None:
        """The memcpy table's code for host-to-device copies, when the table can tell copy and source kinds."""
        if not all(self.has("CUPTI_ACTIVITY_KIND_MEMCPY", c) for c in ("copyKind", "srcKind")):
            return None
        return self.enum_id("ENUM_CUDA_MEMCPY_OPER", FALLBACK_MEMCPY_KINDS, "Host-to-Device", "HtoD",
                            "CUDA_MEMCPY_KIND_HTOD")

    def memory_kind(self, kind: str) -> int | None:
        """Code of a copy's source memory kind: ``pageable`` or ``pinned``."""
        return self.enum_id("ENUM_CUDA_MEM_KIND", FALLBACK_MEM_KINDS, kind.capitalize(),
                            f"CUDA_MEMOPR_MEMORY_KIND_{kind.upper()}")

    # ---- decoded entities -------------------------------------------------
    def gpu_names(self) -> dict[int, str]:
        if self.has("TARGET_INFO_GPU", "name"):
            key = "id" if self.has("TARGET_INFO_GPU", "id") else "deviceId"
            return {int(i): str(n) for i, n in self.conn.execute(f"SELECT {key}, name FROM TARGET_INFO_GPU")}
        if self.has("TARGET_INFO_CUDA_GPU", "name"):
            return {int(i): str(n) for i, n in self.conn.execute("SELECT deviceId, name FROM TARGET_INFO_CUDA_GPU")}
        return {}

    def thread_names(self) -> dict[int, str]:
        if not self.has("ThreadNames"):
            return {}
        rows = self.conn.execute("SELECT globalTid, nameId FROM ThreadNames ORDER BY priority").fetchall()
        names = self.strings({n for _, n in rows})
        return {int(g): names[int(n)] for g, n in rows}

    def cpu_cores(self) -> int | None:
        """Logical CPUs of the profiled machine (TARGET_INFO_SYSTEM_ENV ``CpuCores``), or None."""
        if not self.has("TARGET_INFO_SYSTEM_ENV", "name") or not self.has("TARGET_INFO_SYSTEM_ENV", "value"):
            return None
        row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CpuCores'").fetchone()
        try:
            return int(row[0]) if row and int(row[0]) > 0 else None
        except (TypeError, ValueError):
            return None

    def process_names(self) -> dict[int, str]:
        if not self.has("PROCESSES"):
            return {}
        return {int(g): str(n or "") for g, n in self.conn.execute("SELECT globalPid, name FROM PROCESSES")}
