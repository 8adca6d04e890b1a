"""``nvtx-trace tune SCRIPT.py [ARGS]``: stack the fixes that hold, one profile after another.

Thin on purpose: ``nvtx_trace.runner.tune`` profiles, tries and judges; this checks the request, shows progress
on stderr, prints the table and writes the folder (tune.json after every stage, tune.html at the end, a
history row per stage).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from nvtx_trace.errors import UsageError
from nvtx_trace.report.console import console

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}
TUNE_JSON, TUNE_HTML = "tune.json", "tune.html"


def tune(
    target: List[str] = typer.Argument(None, metavar="SCRIPT.py [ARGS]... | -m MODULE [ARGS]...",
                                       help="The training script (or -m module) and its arguments."),
    budget: float = typer.Option(1200, "--budget", help="Seconds of wall time for the whole tuning."),
    rounds: int = typer.Option(2, "--rounds", help="Runs of each side of a trial, alternating."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder for the outputs (default: ./nvtx-trace-out/<name>-tune-<time>/)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write tune.json to this path."),
    force: bool = typer.Option(False, "--force", "-f", help="Allow an --out folder or --json file that exists."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script (default: this one)."),
    history_path: Optional[Path] = typer.Option(
        None, "--history", help="Run history database (default: $NVTX_TRACE_HISTORY, else the platform's data "
                                "folder; see nvtx-trace history)."),
    no_history: bool = typer.Option(False, "--no-history", help="Record nothing in the run history."),
) -> None:
    """Profile the script, try the fix that promises most (a knob, no edit), keep it only if the step is
    measured faster and the losses agree, profile again, until nothing left promises 3 % or the budget is
    spent. Says how to keep what was kept. Writes tune.json and tune.html.

    Example: nvtx-trace tune --budget 900 train.py --epochs 1
    """
    from nvtx_trace.capture import interrupts

    with interrupts.Guard():  # the run in progress ends with us; what was kept so far is written
        _tune(target or [], budget, rounds, out, json_out, force, python, history_path, no_history)


def _program(target: list[str]) -> tuple[list[str], Path | None]:
    """The program and the script file it runs (None for a module): a script, ``-m MODULE`` or a torchrun job."""
    from nvtx_trace.capture import torchrun

    launch = torchrun.parse(target)
    if launch is not None:
        if not launch.program or launch.kind == "command":
            raise UsageError("torchrun: give the script (or -m module) its ranks run, not --no-python: nvtx-trace "
                             "tune -- torchrun --nproc_per_node=N train.py [ARGS]")
        if launch.kind == "module":
            return target, None
        script = Path(launch.program[0])
        if not script.is_file():
            raise UsageError(f"{script}: no such file")
        return target, script
    if target[:1] == ["-m"]:
        if len(target) < 2:
            raise UsageError("-m needs a module: nvtx-trace tune -m pkg.module [ARGS]")
        return target, None
    if not target or not target[0].endswith(".py"):
        shown = target[0] if target else "nothing"
        raise UsageError(f"expected SCRIPT.py, -m MODULE or -- torchrun ..., got {shown}: nvtx-trace tune "
                         "SCRIPT.py [ARGS]")
    if not Path(target[0]).is_file():
        raise UsageError(f"{target[0]}: no such file")
    return target, Path(target[0])


def _tune(target, budget, rounds, out, json_out, force, python, history_path, no_history) -> None:
    from nvtx_trace.capture import interrupts
    from nvtx_trace.files import check_outputs, file_digest, inside, make_folder, same_path
    from nvtx_trace.runner import history
    from nvtx_trace.runner.plan import DEFAULT_OUT_ROOT, fresh_folder, given_folder, run_name
    from nvtx_trace.runner.tune import Tuner, check_budget

    began = time.time()
    program, script = _program(target)
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    check_budget(budget)
    digest = file_digest(script) if script else None
    if out is not None:
        given_folder(out)
        taken = [n for n in (TUNE_JSON, TUNE_HTML, "stage-1") if (out / n).exists()]
        if taken and not force:
            raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
        folder = out.resolve()
    else:
        from nvtx_trace.runner.plan import classify

        module = program[0] == "-m"
        mode = classify(program[1:] if module else program, module)
        stem = run_name(program[1:] if module else program, mode)
        folder = fresh_folder(Path(DEFAULT_OUT_ROOT), f"{stem}-tune", began)
    inputs = [script] if script else []
    if json_out:
        if inside(json_out, folder):
            raise UsageError(f"--json {json_out} is inside the tune folder {folder}, which gets {TUNE_JSON} "
                             "itself; give --json a path outside it")
        check_outputs([json_out], inputs, force)
    history_db = history.resolve_path(history_path, disabled=no_history)
    history.check(history_db, inputs=inputs,
                  written=lambda p: inside(p, folder) or (json_out is not None and same_path(p, json_out)))
    made = not folder.exists()
    make_folder(folder)

    def say(message: str) -> None:
        print(f"nvtx-trace tune: {message}", file=sys.stderr, flush=True)

    say(f"{' '.join(program)}: budget {budget:.0f} s; each stage profiles (nsys) and times one knob plain, "
        f"{rounds} round(s) a side; outputs in {folder}")
    tuner = Tuner(program, folder, python, budget, rounds, say)
    try:
        result = tuner.run(on_stage=lambda r: _write_json(folder, r))
    except interrupts.Interrupted as exc:
        tuner.stopped = "interrupted"
        if tuner.stages:
            _write(folder, tuner.result(), json_out)
            exc.kept = (f"kept so far: {_kept_text(tuner.kept)}; the stages so far are in {folder / TUNE_JSON}")
        elif made and not any(p.is_file() for p in folder.rglob("*")):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            exc.kept = exc.kept or f"no stage ended; what the runs wrote is in {folder}"
        raise
    except Exception:
        if made and not any(p.is_file() for p in folder.rglob("*")):
            shutil.rmtree(folder, ignore_errors=True)
        raise

    from nvtx_trace.report import tune_render
    from nvtx_trace.runner.try_runs import said_after_writing

    tune_render.text(result, console(highlight=False))
    written = _write(folder, result, json_out)
    said_after_writing(say, written, script or None, digest, "tuned", folder,
                       lambda: history.after_tune(result, program, folder, history_db, began))
    if not any(s["knobs"] for s in result["stages"]) and result["stopped"] != "nothing left":
        raise UsageError(f"nothing was tried ({result['stopped']}): the profile alone took "
                         f"{result['elapsed_s']:.0f} s of the {budget:.0f} s budget; give a larger --budget")


def _kept_text(kept: dict) -> str:
    from nvtx_trace import names

    return names.knobs_text(kept) or "nothing"


def _write_json(folder: Path, result: dict) -> None:
    from nvtx_trace.files import write_atomically

    write_atomically(folder / TUNE_JSON, json.dumps(result, indent=2) + "\n")


def _write(folder: Path, result: dict, json_out: Path | None) -> list[Path]:
    from nvtx_trace.files import write_atomically
    from nvtx_trace.report import tune_render

    text = json.dumps(result, indent=2) + "\n"
    write_atomically(folder / TUNE_JSON, text)
    write_atomically(folder / TUNE_HTML, tune_render.html(result))
    written = [folder / TUNE_JSON, folder / TUNE_HTML]
    if json_out:
        write_atomically(json_out, text)
        written.append(json_out)
    return written



