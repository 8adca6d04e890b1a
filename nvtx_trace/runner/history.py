"""Run history: one row per ``nvtx-trace run`` in a local SQLite database, so that a run can say what
changed since the last run of the same script (the advice loop: change one thing, run again).

This module is what the verbs (``run``, ``try``, ``tune``) call: where the history lives, a history that can never
be written refused before anything runs, the rows recorded once the outputs are written (never failing the verb),
and the line saying what changed. The database is history_store.py; what a row holds, history_rows.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from nvtx_trace.runner.history_rows import finding_rows, run_row, try_rows, tune_rows
from nvtx_trace.runner.history_store import ENV, HistoryError, connect, record, whose
from nvtx_trace.units import ms

OFF = {"off", "0", "no", "false", "none"}


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
        conn = connect(path, write=False)
    except HistoryError:  # not SQLite at all: nothing can be written into it, the run warns in one line
        return
    try:
        whose(conn, path)
    except HistoryError as exc:  # SQLite, and someone else's: writing would succeed, and change it
        raise UsageError(str(exc)) from None
    finally:
        conn.close()


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
