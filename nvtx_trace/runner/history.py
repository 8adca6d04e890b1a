"""Run history: one row per ``nvtx-trace run`` in a local SQLite database, so that a run can say what
changed since the last run of the same script (the advice loop: change one thing, run again).

Tables (docs/json-schema.md, "history"): ``runs`` (one row per run, and one per variant ``nvtx-trace try``
timed: ``kind`` says which) and ``findings`` (one row per finding of a run, ``run_id`` -> ``runs.id``).
Written with sqlite-utils; columns may be added by later versions, never renamed; each gets its type when it
is made (TYPES), not from the first value written, which may be null. A history that cannot be written never
fails a run: the caller turns :class:`HistoryError` into one warning line.
"""

from __future__ import annotations

import json
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
# column types: a column made from a first row holding null would otherwise be TEXT, and hold numbers as text
TYPES = {RUNS: {"id": int, "steps": int, "step_ns_median": int, "step_ns_mean": int, "gpu_busy_fraction": float,
                "findings_count": int, "exit_code": int, "duration_s": float, "git_dirty": int, "try_speedup": float,
                "try_predicted_step_ns": int},
         FINDINGS: {"run_id": int, "impact_ns": int, "predicted_step_ns": int}}


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
    """Settings the report shows evidence of (DataLoader workers per loader)."""
    loaders = (summary.get("dataloader") or {}).get("loaders") or []
    workers = [loader.get("workers") for loader in loaders if loader.get("workers") is not None]
    out = {}
    if len(workers) == 1:
        out["num_workers"] = workers[0]
    elif workers:
        out["num_workers"] = workers
    return out


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
    from nvtx_trace import names

    return names.knobs_text(knobs) if knobs else None


def try_rows(result: dict, program: list[str], folder: Path, started: float, cwd: Path | None = None) -> list[dict]:
    """One ``runs`` row per variant ``nvtx-trace try`` timed (the baseline too): plain steps, no findings; the
    variant's prediction and verdict in ``try_*`` columns."""
    from nvtx_trace.runner.whatif import folder_name

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
            "out_dir": str(folder / folder_name(r["label"])), "exit_code": 0 if step else 1,
            "duration_s": round(time.time() - started, 3),
            "try_speedup": r["speedup"], "try_finding": r["finding"],
            "try_predicted_step_ns": int(r["predicted_step_ms"] * 1e6) if r["predicted_step_ms"] else None,
            "try_verdict": r["verdict"]})
    return rows


def finding_rows(summary: dict | None) -> list[dict]:
    return [{"kind": f["kind"], "cause": (f.get("evidence") or {}).get("cause"), "impact_ns": f.get("impact_ns"),
             "title": f.get("title"), "predicted_step_ns": (f.get("predicted") or {}).get("step_ns"),
             "recommend": json.dumps(f.get("recommend"))} for f in (summary or {}).get("findings") or []]


# ---------------------------------------------------------------- the database


def _open(path: Path, create: bool):
    import sqlite_utils

    if not create and not path.is_file():
        return None
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite_utils.Database(sqlite3.connect(str(path), timeout=10))
        db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a file that is no database fails here
        return db
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None


def _why(exc: Exception) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return f"not a usable SQLite database ({text}); move it away or point --history elsewhere"
    return f"{text}; point --history (or ${ENV}) elsewhere, or pass --no-history"


def record(path: Path, row: dict, findings: list[dict], more: list[dict] = ()) -> tuple[int, dict | None]:
    """Append a run (and ``more`` rows after it, in one transaction); returns (its id, the previous profiled
    run of the same script as a comparable summary or None)."""
    db = _open(path, create=True)
    try:
        previous = _latest(db, row["script"])
        with db.conn:
            _columns(db, RUNS, [row, *more])
            db[RUNS].insert(row, pk="id")
            run_id = db.execute("SELECT last_insert_rowid()").fetchone()[0]
            if findings:
                rows = [{**f, "run_id": run_id} for f in findings]
                _columns(db, FINDINGS, rows)
                db[FINDINGS].insert_all(rows)
            for other in more:
                db[RUNS].insert(other, pk="id")
        return run_id, previous
    except sqlite3.Error as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None
    finally:
        db.conn.close()


def _columns(db, name: str, rows: list[dict]) -> None:
    """Make the table, or the columns it lacks, with their declared types (TYPES; else the first non-null
    value's type, else text)."""
    wanted: dict = {}
    for row in rows:
        for key, value in row.items():
            if wanted.get(key) is None:
                wanted[key] = TYPES[name].get(key) or (type(value) if value is not None else None)
    table = db[name]
    if not table.exists():
        types = {"id": int, **{k: t or str for k, t in wanted.items()}} if name == RUNS else \
            {k: t or str for k, t in wanted.items()}
        table.create(types, pk="id" if name == RUNS else None,
                     foreign_keys=[("run_id", RUNS, "id")] if name == FINDINGS else None)
        return
    have = table.columns_dict
    for key, kind in wanted.items():
        if key not in have:
            table.add_column(key, kind or str)


def _latest(db, script: str) -> dict | None:
    if RUNS not in db.table_names():
        return None
    kind = "AND (kind IS NULL OR kind = 'run')" if "kind" in db[RUNS].columns_dict else ""
    rows = list(db.query(f"SELECT * FROM {RUNS} WHERE script = ? {kind} ORDER BY id DESC LIMIT 1", [script]))
    return as_summary(db, rows[0]) if rows else None


def as_summary(db, run: dict) -> dict:
    """A stored run in the shape of summary.json, as far as nvtx_trace.diff.compare reads it."""
    found = []
    if FINDINGS in db.table_names():
        for f in db.query(f"SELECT * FROM {FINDINGS} WHERE run_id = ? ORDER BY rowid", [run["id"]]):
            found.append({"kind": f["kind"], "evidence": {"cause": f["cause"]}, "impact_ns": f["impact_ns"],
                          "title": f["title"],
                          "predicted": {"step_ns": f["predicted_step_ns"]} if f.get("predicted_step_ns") else None})
    modes = json.loads(run["step_modes"]) if run.get("step_modes") else None
    return {"report": {"path": run.get("out_dir")}, "run": run, "findings": found,
            "steps": {"summary": {"step_ns_median": run.get("step_ns_median"), "step_ns_mean": run.get("step_ns_mean"),
                                  "modes": modes, "gpu_busy_fraction": run.get("gpu_busy_fraction")}}}


def query(path: Path, script: str | None = None, last: int | None = None) -> list[dict]:
    """Stored runs, newest first, each with its ``findings`` list; ``script`` matches part of the script."""
    db = _open(path, create=False)
    if db is None:
        return []
    try:
        if RUNS not in db.table_names():
            return []
        sql = f"SELECT * FROM {RUNS}" + (" WHERE script LIKE ?" if script else "") + " ORDER BY id DESC"
        params = [f"%{script}%"] if script else []
        if last:
            sql += " LIMIT ?"
            params.append(int(last))
        runs = list(db.query(sql, params))
        has_findings = FINDINGS in db.table_names()
        for run in runs:
            for key in ("args", "knobs", "step_modes"):
                run[key] = json.loads(run[key]) if run.get(key) else None
            if run.get("git_dirty") is not None:
                run["git_dirty"] = bool(run["git_dirty"])
            run["findings"] = [
                {k: f[k] for k in ("kind", "cause", "impact_ns", "title", "predicted_step_ns")}
                for f in db.query(f"SELECT * FROM {FINDINGS} WHERE run_id = ? ORDER BY rowid", [run["id"]])
            ] if has_findings else []
        return runs
    except sqlite3.Error as exc:
        raise HistoryError(f"history {path}: {_why(exc)}") from None
    finally:
        db.conn.close()


# ---------------------------------------------------------------- what changed since the last run


def change_line(previous: dict, summary: dict | None) -> str:
    """One line: this run against the previous run of the same script (nvtx_trace.diff.compare)."""
    from nvtx_trace.diff import compare

    run = previous["run"]
    when = str(run.get("started_at") or "")[:16].replace("T", " ")
    commit = f", commit {run['git_commit'][:8]}" if run.get("git_commit") else ""
    head = f"since the last run of this script ({when}{commit}, {run.get('out_dir')}):"
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
    summary = None
    written = result.plan.path("summary.json")
    try:
        if written in result.written:
            summary = json.loads(written.read_text())
        window = result.window.line if getattr(result, "window", None) is not None else None
        tried = result.plan.options.tried if result.plan.options else None
        row = run_row(result.plan, result.exit_code, started, summary, window=window, tried=tried)
        _, previous = record(path, row, finding_rows(summary))
        return (change_line(previous, summary) if previous else None), None
    except HistoryError as exc:
        return None, f"{exc} (run not recorded)"
    except Exception as exc:  # noqa: BLE001 - a history bug must not turn a finished run into a failure
        return None, f"history {path}: not recorded ({type(exc).__name__}: {exc})"


def after_try(result: dict, program: list[str], folder: Path, path: Path | None, started: float) -> str | None:
    """Record what ``nvtx-trace try`` timed, one row per variant; a warning or None. Never raises."""
    if path is None:
        return None
    try:
        rows = try_rows(result, program, folder, started)
        record(path, rows[0], [], rows[1:])
        return None
    except HistoryError as exc:
        return f"{exc} (not recorded)"
    except Exception as exc:  # noqa: BLE001 - the results are already written
        return f"history {path}: not recorded ({type(exc).__name__}: {exc})"
