"""An nsys export as an SQLite database, before any of its tables means anything: which tables and columns it
has, integer columns read in bulk, its string table and its enums. ``Reader`` builds on it and says what nsys's
tables mean; kept apart so that reader.py is about the schema, this module about reading SQLite fast.

Bulk columns come through ``group_concat`` + ``np.fromstring``: the rows never become Python objects, which is ~3x
faster than ``fetchall`` and what lets million-kernel reports load in seconds.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

import numpy as np

from nvtx_trace.errors import BadReportError

if TYPE_CHECKING:
    from nvtx_trace.analyzer.trace.reader import ReportInfo


def as_text(value) -> str | None:
    """A text cell as ``str``: exports written by other tools can store names as BLOBs (decoded as UTF-8, invalid
    bytes replaced) or numbers (written out); NULL stays None for the caller to name."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


class ExportDb:
    """Version-independent access to one export's tables, columns, strings and enums."""

    def __init__(self, conn: sqlite3.Connection, info: ReportInfo):
        self.conn, self.info = conn, info
        self._columns: dict[str, set[str]] = {}
        self._strings: dict[int, str] = {}

    def close(self) -> None:
        self.conn.close()

    def interrupt(self) -> None:
        """Stop a query running on this reader's connection (from another thread)."""
        self.conn.interrupt()

    # ---- schema probing -----------------------------------------------------
    def has(self, table: str, column: str | None = None) -> bool:
        if table not in self.info.tables:
            return False
        if column is None:
            return True
        if table not in self._columns:
            self._columns[table] = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
        return column in self._columns[table]

    def table_columns_present(self, table: str) -> set[str]:
        """Every column of ``table`` (empty when the export has no such table)."""
        if not self.has(table):
            return set()
        self.has(table, "")  # fills the cache
        return set(self._columns[table])

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
            q = f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))}) AND value IS NOT NULL"
            self._strings.update((i, as_text(v)) for i, v in self.conn.execute(q, chunk))
        return {int(i): self._strings.get(int(i), f"<string {int(i)}>") for i in ids}

    def odd_strings(self) -> dict[str, int]:
        """How many StringIds values are NULL or BLOB ({} in every nsys export): names read as ``<string ID>``
        or decoded with replacement characters, which the analysis says in a warning."""
        rows = self.conn.execute("SELECT typeof(value), count(*) FROM StringIds "
                                 "WHERE typeof(value) IN ('null', 'blob') GROUP BY 1").fetchall()
        return {kind: int(n) for kind, n in rows}

    def string_ids(self, like_any: tuple[str, ...], pattern) -> list[int]:
        """Ids of the strings matching ``pattern``; ``like_any`` (SQL LIKE, one must match) narrows the
        scan first so the regex runs on a handful of strings, not on every kernel and range name."""
        where = " OR ".join("value LIKE ?" for _ in like_any)
        rows = self.conn.execute(f"SELECT id, value FROM StringIds WHERE {where}", like_any).fetchall()
        return sorted(int(i) for i, v in rows if v is not None and pattern.search(as_text(v)))

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
