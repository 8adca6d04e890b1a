"""The run history's SQLite database: its explicit, versioned schema, each write one transaction, and reading it
back. Kept apart from what the verbs record (history.py) and what a row holds (history_rows.py): this is the one
module that knows the tables.

Tables (docs/json-schema.md, "history"): ``runs`` (one row per run, and one per variant ``nvtx-trace try``
timed: ``kind`` says which) and ``findings`` (one row per finding of a run, ``run_id`` -> ``runs.id``).
The schema is explicit (COLUMNS, each column typed when the table is made, never by the first value written)
and versioned: the database carries our ``application_id`` and ``user_version`` = SCHEMA_VERSION. A history
made before the version was kept (its number columns may have TEXT affinity, made by a first run that ended
before any step) is migrated when next written, and read as numbers meanwhile. Any other SQLite file (an nsys
export given as ``--history``) is refused before a run starts and never written. Each write is one
transaction: a full disk leaves the database as it was. Columns may be added by later versions, never
renamed. A history that cannot be written never fails a run: the caller turns :class:`HistoryError` into one
warning line.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

from nvtx_trace.errors import NvtxTraceError

ENV = "NVTX_TRACE_HISTORY"  # a database path, or "off" / "0" / "" to record nothing
RUNS, FINDINGS = "runs", "findings"
APPLICATION_ID = 0x6E767478  # "nvtx": PRAGMA application_id of a history nvtx-trace made
SCHEMA_VERSION = 2  # PRAGMA user_version; 0 (none kept): columns typed by the first value written, or typed
#                     when made but unmarked; 2: marked, every column typed when the table is made
COLUMNS = {  # the documented columns (docs/json-schema.md, "Run history"), each with its type
    RUNS: {"id": int, "started_at": str, "kind": str, "tried": str, "script": str, "mode": str, "args": str,
           "cwd": str, "git_commit": str, "git_dirty": int, "torch_version": str, "cuda_version": str,
           "knobs": str, "window": str, "steps": int, "step_ns_median": int, "step_ns_mean": int,
           "step_modes": str, "gpu_busy_fraction": float, "findings_count": int, "out_dir": str, "exit_code": int,
           "duration_s": float, "try_speedup": float, "try_finding": str, "try_predicted_step_ns": int,
           "try_verdict": str, "try_predicted_saving_ns": int},
    FINDINGS: {"run_id": int, "kind": str, "cause": str, "impact_ns": int, "title": str, "predicted_step_ns": int,
               "recommend": str, "predicted_saving_ns": int},
}
SQL_TYPES = {int: "INTEGER", float: "REAL", str: "TEXT"}
# what makes an unmarked database an earlier nvtx-trace history, not someone else's
IDENTITY = {RUNS: {"id", "started_at", "script", "exit_code"}, FINDINGS: {"run_id", "kind", "impact_ns"}}


class HistoryError(NvtxTraceError):
    """The history database cannot be read or written (read-only folder, not a database)."""


def connect(path: Path, write: bool) -> sqlite3.Connection | None:
    """The database at ``path``: None when reading one that does not exist; opened read-only for reading (a
    listing never writes, not even a journal). Transactions are ours (isolation_level None)."""
    if not write and not path.exists():
        return None
    if path.is_dir():
        raise HistoryError(f"history {path}: a directory, not a database file; point --history (or ${ENV}) at a "
                           "file")
    if path.exists() and not path.is_file():
        raise HistoryError(f"history {path}: not a regular file; point --history (or ${ENV}) at a database file")
    try:
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=10, isolation_level=None)
        else:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a file that is no database fails here
        except sqlite3.OperationalError as exc:
            if write or "readonly" not in str(exc) or not Path(f"{path}-journal").exists():
                raise
            # a run killed while writing left a hot journal: rolling it back is recovery, and needs write access
            conn.close()
            conn = sqlite3.connect(str(path), timeout=10, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return conn
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None


def _why(exc: Exception) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return f"not a usable SQLite database ({text}); move it away or point --history elsewhere"
    if "disk is full" in text:
        return f"the disk is full ({text}), nothing was written to it; free some space, point --history (or ${ENV}) " \
               "elsewhere, or pass --no-history"
    return f"{text}; point --history (or ${ENV}) elsewhere, or pass --no-history"


def _tables(conn) -> dict[str, dict[str, str]]:
    """Every table (but SQLite's own) -> its columns and their declared types."""
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {n: {r[1]: (r[2] or "").upper() for r in conn.execute(f'PRAGMA table_info("{n}")')} for n in names}


def whose(conn, path: Path) -> str:
    """``ours`` (marked, this version or older), ``unmarked`` (an earlier nvtx-trace history), or ``empty``;
    HistoryError (one line, nothing written) for any other database."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    tables = _tables(conn)
    if app == APPLICATION_ID:
        return "ours"
    if app == 0 and not tables:
        return "empty"
    if app == 0 and RUNS in tables and set(tables) <= {RUNS, FINDINGS} and all(
            IDENTITY[t] <= set(cols) for t, cols in tables.items()):
        return "unmarked"
    if app != 0:
        what = f"marked as another program's (application_id {app:#x})"
    elif RUNS in tables and set(tables) <= {RUNS, FINDINGS}:
        what = f"its runs table has columns {', '.join(list(tables[RUNS])[:6])}, not nvtx-trace's"
    else:
        shown = list(tables)[:4]
        what = f"it holds tables {', '.join(shown)}" + (f" and {len(tables) - len(shown)} more" if len(tables) > 4
                                                       else "")
    raise HistoryError(f"history {path}: an SQLite database that is not an nvtx-trace run history ({what}); nothing "
                       f"was written to it: point --history (or ${ENV}) at another file")


def record(path: Path, row: dict, findings: list[dict], more: list[dict] = ()) -> tuple[int, dict | None]:
    """Append a run (and ``more`` rows after it) in one transaction, making or migrating the tables first;
    returns (its id, the previous profiled run of the same script as a comparable summary or None)."""
    conn = connect(path, write=True)
    try:
        conn.execute("BEGIN IMMEDIATE")  # one writer; nothing is kept unless everything is
        try:
            state = whose(conn, path)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if state == "empty":
                _create(conn)
            elif state == "unmarked" or version < SCHEMA_VERSION:
                _migrate(conn)
            else:
                _add_missing_columns(conn)
            previous = _latest(conn, row["script"])
            run_id = _insert(conn, RUNS, row)
            for f in findings:
                _insert(conn, FINDINGS, {**f, "run_id": run_id})
            for other in more:
                _insert(conn, RUNS, other)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return run_id, previous
    except sqlite3.Error as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None
    finally:
        conn.close()


def _create(conn, names=(RUNS, FINDINGS)) -> None:
    for name in names:
        conn.execute(_create_sql(name, name))
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _create_sql(name: str, as_name: str, extra: dict | None = None) -> str:
    cols = [f'"{c}" {SQL_TYPES[t]}' + (" PRIMARY KEY" if c == "id" else "") for c, t in COLUMNS[name].items()]
    cols += [f'"{c}" {t}' for c, t in (extra or {}).items()]
    if name == FINDINGS:
        cols.append(f'FOREIGN KEY("run_id") REFERENCES "{RUNS}"("id")')
    return f'CREATE TABLE "{as_name}" ({", ".join(cols)})'


def _migrate(conn) -> None:
    """An earlier history made ours: each table rebuilt with typed columns, every value read as its column's
    type (numbers stored as text become numbers, 'False' becomes 0), columns we do not know kept as they were."""
    tables = _tables(conn)
    for name in (RUNS, FINDINGS):
        if name not in tables:
            conn.execute(_create_sql(name, name))
            continue
        extra = {c: t for c, t in tables[name].items() if c not in COLUMNS[name]}
        conn.execute(_create_sql(name, f"{name}_migrating", extra))
        keep = [c for c in tables[name]]
        for old in conn.execute(f'SELECT {", ".join(chr(34) + c + chr(34) for c in keep)} FROM "{name}" '
                                "ORDER BY rowid").fetchall():
            values = {c: _coerce(old[c], COLUMNS[name].get(c)) for c in keep}
            _insert(conn, f"{name}_migrating", values, known=set(COLUMNS[name]) | set(extra))
        conn.execute(f'DROP TABLE "{name}"')
        conn.execute(f'ALTER TABLE "{name}_migrating" RENAME TO "{name}"')
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _add_missing_columns(conn) -> None:
    """A history of an earlier version lacks the columns added since: added, typed."""
    tables = _tables(conn)
    for name in (RUNS, FINDINGS):
        if name not in tables:
            conn.execute(_create_sql(name, name))
            continue
        for col, kind in COLUMNS[name].items():
            if col not in tables[name]:
                conn.execute(f'ALTER TABLE "{name}" ADD COLUMN "{col}" {SQL_TYPES[kind]}')


def _insert(conn, table: str, row: dict, known: set | None = None) -> int:
    base = table.split("_migrating")[0]
    unknown = set(row) - (known or set(COLUMNS[base]))
    if unknown:  # the schema is explicit: a new column goes into COLUMNS (and the docs) first
        raise ValueError(f"columns not in the history schema: {', '.join(sorted(unknown))}")
    cols = list(row)
    values = [_coerce(row[c], COLUMNS[base].get(c)) if c in COLUMNS[base] else row[c] for c in cols]
    cur = conn.execute(f'INSERT INTO "{table}" ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                       f'VALUES ({", ".join("?" * len(cols))})', values)
    return cur.lastrowid


def _coerce(value, kind):
    """A stored value as its column's type: numbers stored as text read as numbers, 'True'/'False' as 1/0, and
    what cannot be read as the type (a word in a number column) as null, never an error."""
    if value is None or kind is None:
        return value
    if kind is str:
        return value if isinstance(value, str) else (None if isinstance(value, bytes) else str(value))
    if isinstance(value, bytes):
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            value = text == "true"
        else:
            try:
                value = float(text)
            except ValueError:
                return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if kind is int else float(value)


def _typed(row, table: str) -> dict:
    """A row as a dict, each known column as its type (an unmarked history may hold numbers as text)."""
    return {k: _coerce(row[k], COLUMNS[table].get(k)) for k in row.keys()}


def _latest(conn, script: str) -> dict | None:
    if RUNS not in _tables(conn):
        return None
    """The last complete run of the script (exit 0, steps measured), with how many runs after it ended early
    (interrupted, crashed: a comparison with one said "+31 %, improved" or "not comparable"); the last run of
    any kind where none is complete."""
    rows = [_typed(r, RUNS) for r in conn.execute(
        f"SELECT * FROM {RUNS} WHERE script = ? AND (kind IS NULL OR kind = 'run') ORDER BY id DESC LIMIT 100",
        [script])]
    if not rows:
        return None
    later = next((i for i, r in enumerate(rows) if r.get("exit_code") == 0 and r.get("step_ns_median")), 0)
    return {**as_summary(conn, rows[later]), "ended_early_after": later}


def _findings_of(conn, run_id: int) -> list[dict]:
    if FINDINGS not in _tables(conn):
        return []
    return [_typed(f, FINDINGS) for f in conn.execute(f"SELECT * FROM {FINDINGS} WHERE run_id = ? ORDER BY rowid",
                                                       [run_id])]


def as_summary(conn, run: dict) -> dict:
    """A stored run in the shape of summary.json, as far as nvtx_trace.runner.diff.compare reads it."""
    found = [{"kind": f["kind"], "evidence": {"cause": f.get("cause")}, "impact_ns": f.get("impact_ns") or 0,
              "title": f.get("title"),
              "predicted": ({"step_ns": f["predicted_step_ns"], "saving_ns": f.get("predicted_saving_ns")}
                            if f.get("predicted_step_ns") else None)}
             for f in _findings_of(conn, run["id"])]
    modes = _json(run.get("step_modes"))
    return {"report": {"path": run.get("out_dir")}, "run": run, "findings": found,
            "steps": {"summary": {"step_ns_median": run.get("step_ns_median"), "step_ns_mean": run.get("step_ns_mean"),
                                  "modes": modes, "gpu_busy_fraction": run.get("gpu_busy_fraction")}}}


def _json(text):
    """A JSON column decoded; text that is not JSON (a hand-edited row) as null, not an error."""
    if not text or not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def query(path: Path, script: str | None = None, last: int | None = None) -> list[dict]:
    """Stored runs, newest first, each with its ``findings`` list; ``script`` matches part of the script
    (literally: ``%`` and ``_`` are characters, not wildcards). Reads only."""
    conn = connect(path, write=False)
    if conn is None:
        return []
    try:
        if whose(conn, path) == "empty" or RUNS not in _tables(conn):
            return []
        sql = f"SELECT * FROM {RUNS}" + (" WHERE script LIKE ? ESCAPE '\\'" if script else "") + " ORDER BY id DESC"
        params: list = [f"%{_literal(script)}%"] if script else []
        if last:
            sql += " LIMIT ?"
            params.append(min(int(last), 2**62))
        runs = [_typed(r, RUNS) for r in conn.execute(sql, params)]
        for run in runs:
            for key in ("args", "knobs", "step_modes"):
                run[key] = _json(run.get(key))
            if run.get("git_dirty") is not None:
                run["git_dirty"] = bool(run["git_dirty"])
            run["findings"] = [{k: f.get(k) for k in ("kind", "cause", "impact_ns", "title", "predicted_step_ns",
                                                      "predicted_saving_ns")}
                               for f in _findings_of(conn, run["id"])]
        return runs
    except sqlite3.Error as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None
    finally:
        conn.close()


def _literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
