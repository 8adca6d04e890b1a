"""`nvtx-trace try KNOB=VALUE... train.py args...`: apply a fix without editing the script, and measure it.

Thin on purpose: ``nvtx_trace.runner.whatif`` runs, times and judges; this parses the knobs, shows progress
on stderr, prints the table and writes the folder: try.json, try.html, one summary.json per variant (what
``nvtx-trace diff`` compares) and each run's output, and a history row per variant.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import List, Optional

import typer

from nvtx_trace import names
from nvtx_trace.errors import UsageError
from nvtx_trace.report.console import console

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}
TRY_JSON, TRY_HTML = "try.json", "try.html"


def try_(
    target: List[str] = typer.Argument(
        None, metavar="KNOB=VALUE... SCRIPT.py [ARGS]...",
        help=f"Knobs, then the script and its arguments. Knobs: {', '.join(names.KNOBS)}."),
    rounds: int = typer.Option(2, "--rounds", help="Runs of the baseline and of each variant, alternating."),
    each: bool = typer.Option(False, "--each", help="Try each knob on its own (default: all of them together)."),
    from_run: Optional[Path] = typer.Option(
        None, "--from", help="A run folder or summary.json: its findings' predictions go beside the measurements."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder for the outputs (default: ./nvtx-trace-out/<name>-try-<time>/)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write try.json to this path."),
    force: bool = typer.Option(False, "--force", "-f", help="Allow an --out folder or --json file that exists."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script (default: this one)."),
    advice: bool = typer.Option(
        False, "--advice", help="Profile first (nvtx-trace run), then try each top finding's own knobs, one at a time."),
    history_path: Optional[Path] = typer.Option(
        None, "--history", help="Run history database (default: $NVTX_TRACE_HISTORY, else the platform's data "
                                "folder; see nvtx-trace history)."),
    no_history: bool = typer.Option(False, "--no-history", help="Record nothing in the run history."),
) -> None:
    """Run the script as it is and with the knobs applied (no profiler attached), time the steady steps of
    each, alternating, and say what each knob saved; with --from, whether the prediction held. Writes
    try.json, try.html and one folder per variant (nvtx-trace diff FOLDER/baseline FOLDER/<variant> compares
    two), and records each variant in the run history.

    Example: nvtx-trace try --from nvtx-trace-out/train-1 amp=bf16 tf32=1 train.py --epochs 1
    """
    from nvtx_trace.capture import interrupts

    with interrupts.Guard():  # SIGINT, SIGTERM, SIGHUP: the timed program ends with us, one line says so
        _try(target, rounds, each, from_run, out, json_out, force, python, advice, history_path, no_history)


def _try(target, rounds, each, from_run, out, json_out, force, python, advice, history_path, no_history) -> None:
    import time

    from nvtx_trace.capture import interrupts
    from nvtx_trace.files import check_outputs, file_digest, inside, make_folder, same_path
    from nvtx_trace.runner import history

    began = time.time()
    knobs, program = _split(target or [], need_knobs=not advice)
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if advice and (knobs or from_run):
        raise UsageError("--advice takes its knobs from the profile it runs: give neither knobs nor --from with it")
    script_hash = file_digest(Path(program[0]))
    folder = _folder(out, program, force, began)
    inputs = [Path(program[0]), *([from_run] if from_run else [])]
    _check_apart(folder, from_run, json_out)
    if json_out:
        check_outputs([json_out], inputs, force)
    history_db = history.resolve_path(history_path, disabled=no_history)
    history.check(history_db, inputs=inputs,
                  written=lambda p: inside(p, folder) or (json_out is not None and same_path(p, json_out)))
    profile = _summary(from_run) if from_run else {}  # a bad --from is refused before anything runs
    made = not folder.exists()
    make_folder(folder)
    try:
        _measure(folder, program, knobs, advice, each, rounds, python, from_run, profile, json_out, script_hash,
                 history_db, began)
    except interrupts.Interrupted as exc:  # the guard ended the timed program (and its workers) already
        kept = any(p.is_file() for p in folder.rglob("*"))
        if not kept and made:
            shutil.rmtree(folder, ignore_errors=True)
        exc.kept = exc.kept or (f"no variant was measured to the end; the output of the runs so far is kept in "
                                f"{folder}" if kept else "nothing was measured")
        raise


def _measure(folder, program, knobs, advice, each, rounds, python, from_run, profile, json_out, script_hash,
             history_db, began) -> None:
    """The runs, then try.json, try.html, one summary.json per variant and the history rows."""

    from nvtx_trace.files import file_digest, make_folder, write_atomically
    from nvtx_trace.report import try_render
    from nvtx_trace.runner import history, whatif

    def say(message: str) -> None:
        print(f"nvtx-trace try: {message}", file=sys.stderr, flush=True)

    if advice:
        from_run, profile, sets = whatif.advice(program, python, folder / "profile", say)
    else:
        sets = [{k: v} for k, v in knobs.items()] if each else [knobs]
    result = whatif.measure(program, sets, rounds, python, folder, profile, str(from_run) if from_run else None, say)
    try_render.text(result, console(highlight=False))
    text = json.dumps(result, indent=2) + "\n"
    written = [folder / TRY_JSON, folder / TRY_HTML]
    write_atomically(written[0], text)
    write_atomically(written[1], try_render.html(result))
    for r in result["variants"]:
        sub = folder / whatif.folder_name(r["label"])
        make_folder(sub)
        write_atomically(sub / "summary.json", json.dumps(whatif.summary_of(r, sub), indent=2) + "\n")
    if json_out:
        write_atomically(json_out, text)
        written.append(json_out)
    if file_digest(Path(program[0])) != script_hash:  # a promise: the knobs never touch the user's files
        say(f"warning: {program[0]} changed while it was tried (not by nvtx-trace: it writes only to {folder})")
    for path in written:
        print(f"Wrote {path}", file=sys.stderr)
    warning = history.after_try(result, program, folder, history_db, began)
    if warning:
        say(f"warning: {warning}")
    if len(result["variants"]) > 1:
        first = whatif.folder_name(result["variants"][1]["label"])
        print(f"Next: nvtx-trace diff {folder / 'baseline'} {folder / first}", file=sys.stderr)




def _folder(out: Path | None, program: list[str], force: bool, now: float) -> Path:
    """The outputs' folder, checked before anything runs: --out, or a fresh one under ./nvtx-trace-out."""
    from nvtx_trace.runner.plan import DEFAULT_OUT_ROOT, fresh_folder, given_folder, run_name

    if out is not None:
        given_folder(out)
        taken = [name for name in (TRY_JSON, TRY_HTML, "baseline") if (out / name).exists()]
        if taken and not force:
            raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
        return out.resolve()
    return fresh_folder(Path(DEFAULT_OUT_ROOT), f"{run_name(program, 'script')}-try", now)


def _check_apart(folder: Path, from_run: Path | None, json_out: Path | None) -> None:
    """The try folder is written whole (try.json, try.html, a folder per variant): the --from run it reads
    must not lie in it, it must not lie in the --from folder, and --json must not be one of its files."""
    from nvtx_trace.files import inside, same_file, same_path

    if from_run is not None:
        if same_file(from_run, folder) or same_path(from_run, folder) or inside(from_run, folder):
            raise UsageError(f"--from {from_run} is inside the --out folder {folder}, which this try writes; "
                             "choose another --out")
        if inside(folder, from_run):
            raise UsageError(f"--out {folder} is inside --from {from_run}, a folder given as input; "
                             "choose another --out")
    if json_out is not None and inside(json_out, folder):
        raise UsageError(f"--json {json_out} is inside the try folder {folder}, which gets {TRY_JSON} itself; "
                         "give --json a path outside it")




def _split(target: list[str], need_knobs: bool = True) -> tuple[dict, list[str]]:
    """KNOB=VALUE words first, then the program."""
    knobs: dict = {}
    i = 0
    while i < len(target) and "=" in target[i] and not target[i].startswith("-") and not target[i].endswith(".py"):
        try:
            given = names.parse_knobs(target[i])
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
                         f"{', '.join(names.KNOBS)})")
    if program and Path(program[0]).is_dir():
        raise UsageError(f"{program[0]} is a folder; give the script, e.g. {Path(program[0]) / 'train.py'}")
    if not program or not program[0].endswith(".py"):
        raise UsageError("no script after the knobs: nvtx-trace try KNOB=VALUE... SCRIPT.py [ARGS] "
                         "(or nvtx-trace try --advice SCRIPT.py [ARGS])")
    if not Path(program[0]).is_file():
        raise UsageError(f"{program[0]}: no such file")
    return knobs, program


def _summary(path: Path) -> dict:
    from nvtx_trace.runner.diff import load_summary

    return load_summary(path)
