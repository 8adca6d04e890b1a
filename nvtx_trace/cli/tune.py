"""``nvtx-trace tune SCRIPT.py [ARGS]``: stack the fixes that hold, one profile after another.

Thin on purpose: this parses the options; ``nvtx_trace.runner.tune`` checks the outputs, profiles, tries and
judges, shows progress on stderr, prints the table and writes the folder (tune.json after every stage, tune.html
at the end, a history row per stage).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from nvtx_trace.cli import shared_options

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def tune(
    ctx: typer.Context,
    target: List[str] = typer.Argument(None, metavar="SCRIPT.py [ARGS]... | -m MODULE [ARGS]...",
                                       help="The training script (or -m module) and its arguments."),
    budget: Optional[float] = typer.Option(
        None, "--budget", help="Seconds of wall time for the whole tuning, never passed (default 600)."),
    rounds: int = typer.Option(2, "--rounds", help="Runs of each side of a trial, alternating."),
    out: Optional[Path] = shared_options.out("<name>-tune-<time>"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write tune.json to this path."),
    force: bool = shared_options.force(),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script (default: this one)."),
    history_path: Optional[Path] = shared_options.history(),
    no_history: bool = shared_options.no_history(),
) -> None:
    """Profile the script, try the fix that promises most (a knob, no edit), keep it only if the step is
    measured faster and the losses agree, profile again, until nothing left promises 3 % or the budget is
    spent. Says how to keep what was kept. Writes tune.json and tune.html.

    Example: nvtx-trace tune --budget 900 train.py --epochs 1
    """
    from nvtx_trace.capture import interrupts
    from nvtx_trace.cli.own_options import refuse_unknown
    from nvtx_trace.runner.tune import TuneRequest, run_tune
    from nvtx_trace.runner.tune_stages import DEFAULT_BUDGET_S

    refuse_unknown(ctx, target, "tune")
    request = TuneRequest(target or [], budget=DEFAULT_BUDGET_S if budget is None else budget, rounds=rounds,
                          out=out, json_out=json_out, force=force, python=python, history_path=history_path,
                          no_history=no_history)
    with interrupts.Guard():  # the run in progress ends with us; what was kept so far is written
        run_tune(request)
