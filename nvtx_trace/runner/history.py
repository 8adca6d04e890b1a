"""Run history: one row per ``nvtx-trace run`` in a local SQLite database, so that a run can say what
changed since the last run of the same script (the advice loop: change one thing, run again).

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
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from nvtx_trace.analyzer.findings import ms
from nvtx_trace.errors import NvtxTraceError

ENV = "NVTX_TRACE_HISTORY"  # a database path, or "off" / "0" / "" to record nothing
OFF = {"off", "0", "no", "false", "none"}
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


def default_path(environ=os.environ, platform: str = sys.platform) -> Path:
    """Where user data lives by platform convention: XDG on Linux, Application Support on macOS, LOCALAPPDATA
    on Windows."""
    home = Path(environ.get("HOME") or Path.home())
    if platform == "darwin":
        base = home / "Library" / "Application Support"
    elif platform.startswith("win"):
        base = Path(environ.get("LOCALAPPDATA") or home / "AppData" / "Local")
    else:
        base = Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return base / "nvtx-trace" / "history.db"


def resolve_path(option: Path | None = None, disabled: bool = False, environ=os.environ) -> Path | None:
    """``--history PATH`` over ``$NVTX_TRACE_HISTORY`` over the platform default; None when switched off."""
    if disabled:
        return None
    if option is not None:
        return Path(option).expanduser()
    if ENV in environ:
        value = environ[ENV].strip()
        return None if value.lower() in OFF or not value else Path(value).expanduser()
    return default_path(environ)


# ---------------------------------------------------------------- what a run is


def script_key(target: list[str], mode: str, cwd: Path) -> str:
    """What "the same script" means: its absolute path, ``-m module`` (with the folder it runs in), or the
    command up to its first .py argument, made absolute (``torchrun --nproc_per_node=2 /abs/train.py``: the
    script's own arguments may change between runs, as they do for a script)."""
    if mode == "script":
        return str((cwd / target[0]).resolve())
    if mode == "module":
        return f"-m {target[0]} @ {cwd}"
    words = []
    for word in target:
        if word.endswith(".py") and (cwd / word).is_file():
            words.append(str((cwd / word).resolve()))
            break
        words.append(word)
    return shlex.join(words)


def _git(folder: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the repository holding ``folder``; (None, None) outside one or without git."""
    git = shutil.which("git")
    if git is None:
        return None, None
    try:
        head = subprocess.run([git, "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, stdin=subprocess.DEVNULL)
        if head.returncode != 0:
            return None, None
        status = subprocess.run([git, "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def _target_python(plan) -> str | None:
    """The interpreter that ran the program: argv[0] for a script or module, a command's python shebang."""
    if plan.mode in ("script", "module"):
        return plan.argv[0]
    first = shutil.which(plan.argv[0])
    if first is None:
        return None
    if re.search(r"python[\d.]*$", Path(first).name):
        return first
    try:
        with open(first, "rb") as fh:
            line = fh.readline(200).decode("utf-8", "replace")
    except OSError:
        return None
    match = re.match(r"#!\s*(\S*python[\d.]*)\s*$", line.strip())
    return match.group(1) if match else None


def knobs(summary: dict) -> dict:
    """Settings the report shows evidence of (DataLoader workers per loader): each knob's ``observed``."""
    from nvtx_trace import knobs as declared

    return declared.observed(summary)


def run_row(plan, exit_code: int, started: float, summary: dict | None, cwd: Path | None = None,
            window: str | None = None, tried: dict | None = None) -> dict:
    """The ``runs`` row of one finished run (``summary``: its summary.json, None when none was written)."""
    from nvtx_trace.capture import target_python

    cwd = Path(cwd or os.getcwd()).resolve()
    opts = plan.options
    target = list(opts.target) if opts else list(plan.argv)
    where = (cwd / target[0]).resolve().parent if plan.mode == "script" else cwd
    commit, dirty = _git(where)
    python = _target_python(plan)
    probe = target_python.probe(python) if python else {}
    stats = ((summary or {}).get("steps") or {}).get("summary") or {}
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "kind": "run", "tried": _knob_text(tried),
        "script": script_key(target, plan.mode, cwd), "mode": plan.mode,
        "args": json.dumps(target[1:]), "cwd": str(cwd), "git_commit": commit,
        "git_dirty": None if dirty is None else int(dirty),
        "torch_version": probe.get("torch"), "cuda_version": probe.get("cuda_version"),
        "knobs": json.dumps(knobs(summary or {})), "window": window,
        "steps": stats.get("steps"), "step_ns_median": stats.get("step_ns_median"),
        "step_ns_mean": stats.get("step_ns_mean"), "step_modes": json.dumps(stats.get("modes")),
        "gpu_busy_fraction": stats.get("gpu_busy_fraction"),
        "findings_count": len((summary or {}).get("findings") or []),
        "out_dir": str(plan.out_dir), "exit_code": exit_code,
        "duration_s": round(time.time() - started, 3),
    }


def _knob_text(knobs: dict | None) -> str | None:
    from nvtx_trace import knobs as declared

    return declared.text(knobs) if knobs else None


def try_rows(result: dict, program: list[str], folder: Path, started: float, cwd: Path | None = None) -> list[dict]:
    """One ``runs`` row per variant ``nvtx-trace try`` timed (the baseline too): plain steps, no findings; the
    variant's prediction and verdict in ``try_*`` columns."""
    from nvtx_trace.files import variant_folder

    cwd = Path(cwd or os.getcwd()).resolve()
    commit, dirty = _git((cwd / program[0]).resolve().parent)
    rows = []
    for r in result["variants"]:
        stat, step = r["statistic"], r["measured_step_ms"]
        rows.append({
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "kind": "try", "tried": _knob_text(r["knobs"]) or "baseline",
            "script": script_key(program, "script", cwd), "mode": "script", "args": json.dumps(program[1:]),
            "cwd": str(cwd), "git_commit": commit, "git_dirty": None if dirty is None else int(dirty),
            "knobs": json.dumps(r["knobs"]), "window": f"plain (no profiler), {len(r['rounds_ms'])} round(s)",
            "steps": None, f"step_ns_{stat}": int(step * 1e6) if step else None,
            "gpu_busy_fraction": None, "findings_count": 0,
            "out_dir": str(folder / variant_folder(r["label"])), "exit_code": 0 if step else 1,
            "duration_s": round(time.time() - started, 3),
            "try_speedup": r["speedup"], "try_finding": r["finding"],
            "try_predicted_step_ns": int(r["predicted_step_ms"] * 1e6) if r["predicted_step_ms"] else None,
            "try_predicted_saving_ns": _ns(r.get("predicted_saving_ms")) if r.get("predicted_step_ms") else None,
            "try_verdict": r["verdict"]})
    return rows


def tune_rows(result: dict, program: list[str], folder: Path, started: float, cwd: Path | None = None) -> list[dict]:
    """One ``runs`` row per stage of ``nvtx-trace tune`` that timed a knob: the configuration with it (``tried``),
    its plain step, its finding's prediction, and ``kept``/``rejected`` as the verdict."""
    from nvtx_trace.runner.plan import classify

    cwd = Path(cwd or os.getcwd()).resolve()
    module = program[0] == "-m"
    mode = classify(program[1:] if module else program, module)
    commit, dirty = _git(cwd if mode != "script" else (cwd / program[0]).resolve().parent)
    rows = []
    for s in result["stages"]:
        if not s["knobs"]:
            continue
        stat, step = s.get("statistic") or "median", s.get("measured_step_ms")
        rows.append({
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "kind": "tune", "tried": _knob_text({**s["configuration"], **s["knobs"]}),
            "script": script_key(program[1:] if module else program, mode, cwd),
            "mode": mode, "args": json.dumps(program[2:] if module else program[1:]),
            "cwd": str(cwd), "git_commit": commit, "git_dirty": None if dirty is None else int(dirty),
            "knobs": json.dumps({**s["configuration"], **s["knobs"]}),
            "window": f"plain (no profiler), tune stage {s['stage']}, {len(s['rounds_ms']['variant'])} round(s)",
            "steps": None, f"step_ns_{stat}": int(step * 1e6) if step else None,
            "gpu_busy_fraction": None, "findings_count": 0, "out_dir": str(folder / f"stage-{s['stage']}"),
            "exit_code": 0 if step else 1, "duration_s": s["elapsed_s"],
            "try_speedup": s.get("speedup"), "try_finding": s["finding"],
            "try_predicted_step_ns": int(s["predicted_step_ms"] * 1e6) if s["predicted_step_ms"] else None,
            "try_predicted_saving_ns": _ns(s.get("predicted_saving_ms")),
            "try_verdict": "kept" if s["kept"] else "rejected"})
    return rows


def _ns(value_ms: float | None) -> int | None:
    """A saving in ms as the history keeps it, in ns (the finding's own integer, without float drift)."""
    return None if value_ms is None else int(round(value_ms * 1e6))


def finding_rows(summary: dict | None) -> list[dict]:
    return [{"kind": f["kind"], "cause": (f.get("evidence") or {}).get("cause"), "impact_ns": f.get("impact_ns"),
             "title": f.get("title"), "predicted_step_ns": (f.get("predicted") or {}).get("step_ns"),
             "predicted_saving_ns": (f.get("predicted") or {}).get("saving_ns"),
             "recommend": json.dumps(f.get("recommend"))} for f in (summary or {}).get("findings") or []]


# ---------------------------------------------------------------- the database


def _connect(path: Path, write: bool) -> sqlite3.Connection | None:
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


def _state(conn, path: Path) -> str:
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


def check(path: Path | None, inputs=(), written=lambda path: False) -> None:
    """Refuse, before anything runs, a history database that can never be written: a directory, one of the
    command's inputs (``inputs``) or outputs (``written(path)`` is true), a file that is not ours. One line
    (UsageError); only reads. A history that fails later (a full disk) still costs only a warning."""
    from nvtx_trace.errors import UsageError
    from nvtx_trace.files import same_file

    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"history {path} is a directory; point --history (or ${ENV}) at a database file")
    for source in inputs:
        if same_file(path, source):
            raise UsageError(f"history {path} is the input {source}; point --history (or ${ENV}) at another file")
    if written(path):
        raise UsageError(f"history {path} is a file this command writes; give the history its own file")
    if path.exists() and not path.is_file():  # /dev/null, a fifo: SQLite would put its journal beside it
        raise UsageError(f"history {path} is not a regular file; point --history (or ${ENV}) at a database file")
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        conn = _connect(path, write=False)
    except HistoryError:  # not SQLite at all: nothing can be written into it, the run warns in one line
        return
    try:
        _state(conn, path)
    except HistoryError as exc:  # SQLite, and someone else's: writing would succeed, and change it
        raise UsageError(str(exc)) from None
    finally:
        conn.close()


def record(path: Path, row: dict, findings: list[dict], more: list[dict] = ()) -> tuple[int, dict | None]:
    """Append a run (and ``more`` rows after it) in one transaction, making or migrating the tables first;
    returns (its id, the previous profiled run of the same script as a comparable summary or None)."""
    conn = _connect(path, write=True)
    try:
        conn.execute("BEGIN IMMEDIATE")  # one writer; nothing is kept unless everything is
        try:
            state = _state(conn, path)
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
    conn = _connect(path, write=False)
    if conn is None:
        return []
    try:
        if _state(conn, path) == "empty" or RUNS not in _tables(conn):
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


# ---------------------------------------------------------------- what changed since the last run


def change_line(previous: dict, summary: dict | None, exit_code: int | None = None) -> str:
    """One line: this run (it ended with ``exit_code``) against the last complete run of the same script
    (nvtx_trace.runner.diff.compare), saying which run that is."""
    from nvtx_trace.runner.diff import compare

    run = previous["run"]
    when = str(run.get("started_at") or "")[:16].replace("T", " ")
    commit = f", commit {run['git_commit'][:8]}" if run.get("git_commit") else ""
    early = previous.get("ended_early_after") or 0
    which = (f"the last complete run of this script ({when}{commit}, {run.get('out_dir')}; the {early} later "
             f"run(s) ended early)" if early else f"the last run of this script ({when}{commit}, {run.get('out_dir')})")
    head = f"since {which}" + (f", this run ending with status {exit_code}" if exit_code else "") + ":"
    if not summary:
        return f"{head} no comparison, this run wrote no summary"
    result = compare(previous, summary)
    parts = []
    stat = result["step_statistic"]
    before, after = result["before"][f"step_ns_{stat}"], result["after"][f"step_ns_{stat}"]
    if before and after:
        parts.append(f"step {ms(before)} -> {ms(after)} ({result['step_change']:+.0%}, {stat})")
    else:
        parts.append("step time not comparable (no steps on one side)")
    b_busy, a_busy = result["before"]["gpu_busy_fraction"], result["after"]["gpu_busy_fraction"]
    if b_busy is not None and a_busy is not None:
        parts.append(f"GPU busy {b_busy:.0%} -> {a_busy:.0%}")
    for status in ("resolved", "improved", "worse", "new"):
        kinds = [_label(f) for f in result["findings"] if f["status"] == status]
        if kinds:
            parts.append(f"{status}: {', '.join(kinds)}")
    if not any(f["status"] != "unchanged" for f in result["findings"]):
        parts.append("findings unchanged" if result["findings"] else "no findings either time")
    return f"{head} {'; '.join(parts)}"


def _label(finding: dict) -> str:
    return finding["kind"] + (f" ({finding['cause']})" if finding.get("cause") else "")



def after_run(result, path: Path | None, started: float) -> tuple[str | None, str | None]:
    """Record a finished run; returns (the change line or None, a warning or None). Never raises: the
    history is a convenience, the run's outputs are already written."""
    if path is None:
        return None, None
    if getattr(result.profile, "program_started", None) is False:  # nsys's failure: the program never ran
        return None, None
    if getattr(result.profile, "stuck", False) and result.profile.rep is None:  # nsys's failure too: no report
        return None, None
    summary = None
    written = result.plan.path("summary.json")
    try:
        if written in result.written:
            summary = json.loads(written.read_text())
        window = result.window.line if getattr(result, "window", None) is not None else None
        tried = result.plan.options.tried if result.plan.options else None
        row = run_row(result.plan, result.exit_code, started, summary, window=window, tried=tried)
        _, previous = record(path, row, finding_rows(summary))
        return (change_line(previous, summary, result.exit_code) if previous else None), None
    except HistoryError as exc:
        return None, f"{exc} (run not recorded)"
    except Exception as exc:  # noqa: BLE001 - a history bug must not turn a finished run into a failure
        return None, f"history {path}: not recorded ({type(exc).__name__}: {exc})"


def after_try(result: dict, program: list[str], folder: Path, path: Path | None, started: float) -> str | None:
    """Record what ``nvtx-trace try`` timed, one row per variant; a warning or None. Never raises."""
    return _record_plain(path, lambda: try_rows(result, program, folder, started))


def after_tune(result: dict, program: list[str], folder: Path, path: Path | None, started: float) -> str | None:
    """Record what ``nvtx-trace tune`` timed, one row per stage that timed a knob; a warning or None."""
    return _record_plain(path, lambda: tune_rows(result, program, folder, started))


def _record_plain(path: Path | None, make_rows) -> str | None:
    """Rows of plain runs (no findings): recorded in one transaction, or a warning; never raises (the results
    are already written)."""
    if path is None:
        return None
    try:
        rows = make_rows()
        if rows:
            record(path, rows[0], [], rows[1:])
        return None
    except HistoryError as exc:
        return f"{exc} (not recorded)"
    except Exception as exc:  # noqa: BLE001 - the results are already written
        return f"history {path}: not recorded ({type(exc).__name__}: {exc})"
