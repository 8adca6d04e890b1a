"""`nvtx-trace try KNOB=VALUE... train.py args...`: apply a fix without editing the script, and measure it.

Thin on purpose: this parses the options and the knobs; ``nvtx_trace.runner.try_runs`` checks the outputs, runs,
times and judges, shows progress on stderr, prints the table and writes the folder (try.json, try.html, one
summary.json per variant, what ``nvtx-trace diff`` compares, and each run's output) and a history row per variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nvtx_trace import knobs as declared
from nvtx_trace.cli import shared_options
from nvtx_trace.errors import UsageError

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def _knob_names() -> str:
    try:
        return ", ".join(declared.names())
    except ValueError as exc:  # a declaration of the user's that does not load: said when a knob is parsed
        return f"(not listed: {exc})"


def try_(
    ctx: typer.Context,
    target: List[str] = typer.Argument(
        None, metavar="KNOB=VALUE... SCRIPT.py [ARGS]...",
        help=f"Knobs, then the script and its arguments. Knobs: {_knob_names()}."),
    rounds: int = typer.Option(2, "--rounds", help="Runs of the baseline and of each variant, alternating."),
    each: bool = typer.Option(False, "--each", help="Try each knob on its own (default: all of them together)."),
    from_run: Optional[Path] = typer.Option(
        None, "--from", help="A run folder or summary.json: its findings' predictions go beside the measurements."),
    out: Optional[Path] = shared_options.out("<name>-try-<time>"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write try.json to this path."),
    force: bool = shared_options.force(),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script (default: this one)."),
    advice: bool = typer.Option(
        False, "--advice", help="Profile first (nvtx-trace run), then try each top finding's own knobs, one at a time."),
    history_path: Optional[Path] = shared_options.history(),
    no_history: bool = shared_options.no_history(),
) -> None:
    """Run the script as it is and with the knobs applied (no profiler attached), time the steady steps of
    each, alternating, and say what each knob saved; with --from, whether the prediction held. Writes
    try.json, try.html and one folder per variant (nvtx-trace diff FOLDER/baseline FOLDER/<variant> compares
    two), and records each variant in the run history.

    Example: nvtx-trace try --from nvtx-trace-out/train-1 amp=bf16 tf32=1 train.py --epochs 1
    """
    from nvtx_trace.capture import interrupts
    from nvtx_trace.cli.own_options import refuse_unknown
    from nvtx_trace.runner.try_runs import TryRequest, run_try

    refuse_unknown(ctx, target, "try")
    knobs, program = _split(target or [], need_knobs=not advice)
    request = TryRequest(program, knobs, rounds=rounds, each=each, from_run=from_run, out=out, json_out=json_out,
                         force=force, python=python, advice=advice, history_path=history_path, no_history=no_history)
    with interrupts.Guard():  # SIGINT, SIGTERM, SIGHUP: the timed program ends with us, one line says so
        run_try(request)


def _split(target: list[str], need_knobs: bool = True) -> tuple[dict, list[str]]:
    """KNOB=VALUE words first, then the program."""
    knobs: dict = {}
    i = 0
    while i < len(target) and "=" in target[i] and not target[i].startswith("-") and not target[i].endswith(".py"):
        try:
            given = declared.parse(target[i])
        except ValueError as exc:
            raise UsageError(f"{exc}") from None
        for key in given.keys() & knobs.keys():
            if given[key] != knobs[key]:
                raise UsageError(f"{key} given twice ({key}={knobs[key]} and {key}={given[key]}); give it once")
        knobs.update(given)
        i += 1
    program = target[i:]
    if not knobs and need_knobs:
        raise UsageError(f"no knob given: nvtx-trace try KNOB=VALUE... SCRIPT.py [ARGS] (knobs: "
                         f"{', '.join(declared.names())})")
    if program and Path(program[0]).is_dir():
        raise UsageError(f"{program[0]} is a folder; give the script, e.g. {Path(program[0]) / 'train.py'}")
    if not program or not program[0].endswith(".py"):
        raise UsageError("no script after the knobs: nvtx-trace try KNOB=VALUE... SCRIPT.py [ARGS] "
                         "(or nvtx-trace try --advice SCRIPT.py [ARGS])")
    if not Path(program[0]).is_file():
        raise UsageError(f"{program[0]}: no such file")
    return knobs, program
