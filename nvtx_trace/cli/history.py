"""`nvtx-trace history`: the runs recorded by `nvtx-trace run`, newest first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from nvtx_trace.errors import NvtxTraceError
from nvtx_trace.report.console import console
from nvtx_trace.report.sections import printable
from nvtx_trace.units import ms


def history(
    script: Optional[str] = typer.Option(None, "--script", "-s", help="Only runs whose script contains this text "
                                                                       "(any case); none: one line naming the scripts "
                                                                       "recorded, exit 1."),
    last: int = typer.Option(20, "--last", "-n", help="Show the newest N runs (0, or more than recorded: all)."),
    json_out: bool = typer.Option(False, "--json", help="Print the runs as JSON (each with its findings)."),
    path: Optional[Path] = typer.Option(
        None, "--history", help="History database (default: $NVTX_TRACE_HISTORY, else the platform's data folder)."),
) -> None:
    """List the runs `nvtx-trace run` recorded: when, which script and commit, the steady step time,
    GPU busy share and the findings of each, newest first.

    Example: nvtx-trace history --script train.py --last 5
    """

    from nvtx_trace.errors import UsageError
    from nvtx_trace.runner.history import resolve_path
    from nvtx_trace.runner.history_store import ENV, query

    if last < 0:
        raise UsageError("--last must be >= 0 (0: all runs)")
    if script is not None and not script.strip():
        raise UsageError("--script was given an empty text, which every script contains; give part of the "
                         "script's name (e.g. --script train.py), or leave --script out for every run")
    if path is not None and path.is_dir():
        raise UsageError(f"--history {path} is a folder; give the database file (e.g. {path / 'history.db'})")
    where = resolve_path(path)
    if where is None:
        raise UsageError(f"the history is switched off (${ENV}={os.environ.get(ENV)!r}); "
                         "give --history PATH")
    runs = _runs(where, script, last)
    if script and not runs:
        recorded = sorted({_short(r.get("script") or "") for r in query(where)} - {""})
        raise NvtxTraceError(f"no run of a script containing {script!r} in {where} (" + (
            f"recorded: {', '.join(recorded[:10])}{' ...' if len(recorded) > 10 else ''}" if recorded
            else "it holds no runs") + "); nvtx-trace history lists them all")
    if json_out:
        print(json.dumps({"history": str(where), "runs": runs}, indent=1))
        return
    out = console()
    if not runs:
        what = f" of a script matching {script!r}" if script else ""
        out.print(printable(f"No runs{what} recorded in {where}"), soft_wrap=True, markup=False)
        return
    _table(runs, where, out)


def _runs(where: Path, script: str | None, last: int) -> list[dict]:
    """The runs asked for; ``script`` matches as the plain text it is (``_`` and ``%`` too: ``my_train`` must not
    find ``myXtrain``; history_store.query escapes them for SQL's LIKE)."""
    from nvtx_trace.runner.history_store import query

    limit = last if 0 < last < 2 ** 63 else None  # 0, or more than SQLite can count: all of them
    return query(where, script=script, last=limit)


def _table(runs: list[dict], where: Path, console) -> None:
    """One line per run (greppable, whole at any terminal width): id, time, script, commit, step, busy, findings."""
    console.print(printable(f"{len(runs)} run(s) in {where}, newest first"), soft_wrap=True, markup=False)
    for run in runs:
        commit = (run.get("git_commit") or "")[:8] + ("+dirty" if run.get("git_dirty") else "")
        busy = run.get("gpu_busy_fraction")
        when = [f"#{run['id']}", str(run.get("started_at") or "")[:16].replace("T", " "),
                _short(run.get("script") or ""), *([commit] if commit else [])]
        if run.get("kind") in ("try", "tune"):  # plain timings: no findings to list, a verdict to say
            console.print(printable("  ".join([*when, _tried(run)])), soft_wrap=True, markup=False, highlight=False)
            continue
        kinds = ", ".join(f"{f['kind']} {ms(f['impact_ns'])}" if f.get("impact_ns") is not None
                          else f["kind"] for f in run["findings"]) or "no findings"
        parts = [*when, *([f"with {run['tried']}"] if run.get("tried") else []),
                 _step(run),
                 f"GPU busy {busy:.0%}" if busy is not None else "GPU busy -", f"exit {run.get('exit_code')}:", kinds]
        console.print(printable("  ".join(parts)), soft_wrap=True, markup=False, highlight=False)  # a script's name
        # with a newline in it would forge a line of ours


def _tried(run: dict) -> str:
    """A variant nvtx-trace try timed, or a stage tune did: its step, against the baseline, and the prediction it
    was judged by (tune's: kept or rejected)."""
    step = run.get("step_ns_mean") or run.get("step_ns_median")
    stat = "mean" if run.get("step_ns_mean") else "median"
    text = f"{run.get('kind')} {run.get('tried')}: " + (f"step {stat} {ms(step)} (plain)" if step else "no step time")
    if run.get("try_speedup"):
        text += f", {float(run['try_speedup']):.2f}x the baseline"
    if run.get("try_predicted_step_ns"):
        text += f"; {run.get('try_finding')} predicted {ms(run['try_predicted_step_ns'])}: {run.get('try_verdict')}"
    elif run.get("kind") == "tune" and run.get("try_verdict"):
        text += f": {run['try_verdict']}"
    return text


def _step(run: dict) -> str:
    """The steady step in the statistic that sets throughput: the mean where steps came in two kinds or were
    uneven (as run's own summary and diff judge them), else the median."""
    from nvtx_trace.analyzer.measures.step_times import typical_statistic

    median, mean = run.get("step_ns_median"), run.get("step_ns_mean")
    if not median:
        return "no steps"
    stat = typical_statistic(float(median), float(mean or 0), run.get("step_modes"))
    return f"step {stat} {ms(mean if stat == 'mean' else median)}"


def _short(script: str) -> str:
    """The script as its folder and file name (train.py of two projects stay apart), or the module/command."""
    if script.startswith("/") and " " not in script:
        path = Path(script)
        return f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    return script
