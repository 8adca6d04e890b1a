"""``nvtx-trace tune``: profile, try what promises most, keep it only if it holds, profile again.

A stage is one profile (``nvtx-trace run``, default window) of the program with the knobs kept so far, and one
trial: the untried finding with the largest predicted saving whose fix a knob applies, timed plain against the
configuration so far, alternating (``timing.alternate``, as ``try``). The knob is kept only when the step is at least 3 %
faster beyond the rounds' spread and the first steps' losses agree within what that knob allows. A kept knob
changes the program, so the next stage profiles it anew (GPU settings are then judged on a profile taken after
a loader fix); a rejected one is never tried again and the same profile offers its next finding. It ends when no
untried finding predicts 3 % or more, or when the budget cannot pay for the next stage.

This module is the command: its checks, the folder, tune.json and tune.html, the history and the exit status. The
stages are ``tune_stages.py``'s loop; what a stage tries and whether it holds, ``tune_trial.py``'s.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace.errors import NvtxTraceError, UsageError
from nvtx_trace.runner import verbs
from nvtx_trace.runner.tune_stages import DEFAULT_BUDGET_S, Tuner

TUNE = verbs.Verb("tune", "tune.json", "tune.html", first="stage-1", done="tuned")
MIN_BUDGET_S = 60  # less cannot pay for one profile and one trial of any program
MIN_RUN_S = 3.0  # a plain run's timed window lasts at least this (nvtx_autotrace.auto_window.TIMED_MIN_SECONDS)


def check_budget(budget_s: float) -> None:
    if not math.isfinite(budget_s):
        raise UsageError(f"--budget {budget_s}: give a number of seconds, {MIN_BUDGET_S:g} or more (default "
                         f"{DEFAULT_BUDGET_S})")
    if budget_s < MIN_BUDGET_S:
        raise UsageError(f"--budget {budget_s:g} s cannot pay for one stage (a profile and a plain trial of "
                         f"runs): give --budget {MIN_BUDGET_S:g} or more (default {DEFAULT_BUDGET_S})")


@dataclass
class TuneRequest:
    """What the user asked `tune` for (cli/tune.py parses it): the program and the options."""

    program: list[str]
    budget: float = DEFAULT_BUDGET_S
    rounds: int = 2
    out: Path | None = None
    json_out: Path | None = None
    force: bool = False
    python: str | None = None
    history_path: Path | None = None
    no_history: bool = False


def run_tune(req: TuneRequest) -> None:
    """The whole of `nvtx-trace tune`: every output checked before anything runs, then the stages, tune.json after
    each (and what was kept so far when interrupted), the table, tune.html and a history row per stage."""
    from nvtx_trace.capture import interrupts
    from nvtx_trace.files import file_digest
    from nvtx_trace.runner import history
    from nvtx_trace.runner.plan import check_module, classify, run_name

    began = time.time()
    declared.check()
    program, script = _program(req.program)
    if program[:1] == ["-m"]:
        check_module(program[1], req.python)
    if req.rounds < 1:
        raise UsageError("--rounds must be at least 1")
    check_budget(req.budget)
    if 2 * req.rounds * MIN_RUN_S > req.budget:
        raise UsageError(f"--rounds {req.rounds}: a trial is {2 * req.rounds} plain runs of at least {MIN_RUN_S:g} s "
                         f"each, more than the --budget of {req.budget:g} s; give fewer --rounds (default 2)")
    digest = file_digest(script) if script else None
    json_out = req.json_out

    def name() -> str:
        module = program[0] == "-m"
        words = program[1:] if module else program
        return f"{run_name(words, classify(words, module))}-tune"

    folder = TUNE.folder(req.out, req.force, name, began)
    inputs = [script] if script else []
    history_db = TUNE.check_outputs(folder, json_out, inputs, req.force, req.history_path, req.no_history)
    made = verbs.make(folder)
    say = TUNE.say
    say(f"{' '.join(program)}: budget {req.budget:.0f} s; each stage profiles (nsys) and times one knob plain, "
        f"{req.rounds} round(s) a side; outputs in {folder}")
    TUNE.say_tmp_warning()
    tuner = Tuner(program, folder, req.python, req.budget, req.rounds, say)
    try:
        result = tuner.run(on_stage=lambda r: _write_json(folder, {**r, "stopped": r["stopped"] or "running"}))
    except interrupts.Interrupted as exc:
        tuner.stopped = "interrupted"
        if tuner.stages or tuner.last_profile:  # a stage, or the first profile at least
            _write(folder, tuner.result(), json_out)
            exc.kept = (f"kept so far: {declared.text(tuner.kept) or 'nothing'}; the stages so far are in "
                        f"{folder / TUNE.json}")
        elif not made or verbs.drop_if_empty(folder, made):
            exc.kept = exc.kept or f"no stage ended; what the runs wrote is in {folder}"
        raise
    except Exception:
        verbs.drop_if_empty(folder, made)
        raise

    from nvtx_trace.report import tune_render
    from nvtx_trace.report.console import console

    tune_render.text(result, console(highlight=False))
    written = _write(folder, result, json_out)
    TUNE.said_after_writing(written, script or None, digest, folder,
                            lambda: history.after_tune(result, program, folder, history_db, began))
    if tuner.failed:  # what was kept is written; the stop itself is a failure to say (a full disk, a folder
        # turned read-only, a configuration that stopped stepping), never an exit 0 with nothing said
        raise NvtxTraceError(f"tune stopped after {len(result['stages'])} stage(s): {result['stopped']}; kept so far: "
                             f"{declared.text(tuner.kept) or 'nothing'} (in {folder / TUNE.json})")
    if not any(s["knobs"] for s in result["stages"]) and result["stopped"] != "nothing left":
        raise UsageError(f"nothing was tried ({result['stopped']}): the profile alone took "
                         f"{result['elapsed_s']:.0f} s of the {req.budget:.0f} s budget, and a trial's "
                         f"{tuner.start_runs()} plain runs would take about {tuner.start_s():.0f} s more; give a "
                         f"larger --budget{' or fewer --rounds' if tuner.start_runs() > 2 else ''}")


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


def _write_json(folder: Path, result: dict) -> None:
    from nvtx_trace.files import write_atomically

    write_atomically(folder / TUNE.json, json.dumps(result, indent=2) + "\n")


def _write(folder: Path, result: dict, json_out: Path | None) -> list[Path]:
    """tune.json and tune.html in the folder (and --json): after the last stage, or when interrupted."""
    from nvtx_trace.report import tune_render

    return TUNE.write(folder, result, tune_render.html(result), json_out)
