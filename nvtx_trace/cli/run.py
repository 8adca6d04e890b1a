"""`nvtx-trace run train.py args...`: profile under nsys with auto-instrumentation, then analyze.

Thin on purpose: this parses the options; ``nvtx_trace.runner.run_verb`` plans and runs, shows progress on
stderr, prints the findings, "Wrote ..." lines and the next command, and records the run in the history.
Everything after the script (or module, or command) belongs to it: our options
come first (``nvtx-trace run --steps 3 train.py --steps 100``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from nvtx_trace.cli import shared_options

if TYPE_CHECKING:
    from nvtx_trace.runner.plan import RunOptions

# Options stop at the first argument: the rest is the program's, even names we also use.
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


def run(
    ctx: typer.Context,
    target: List[str] = typer.Argument(
        None, metavar="SCRIPT.py [ARGS]... | -m MODULE [ARGS]... | -- COMMAND [ARGS]...",
        help="What to run; every argument after it is passed to it unchanged."),
    module: bool = typer.Option(False, "-m", "--module", help="What follows is a module name, run like python -m."),
    out: Optional[Path] = shared_options.out("<name>-<time>"),
    force: bool = shared_options.force("an --out folder that already holds outputs"),
    warmup_steps: Optional[int] = typer.Option(
        None, "--warmup-steps", help="Warm-up steps left out: the capture window starts at step N (with --steps)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Capture window: number of steps to profile."),
    keep_running: bool = typer.Option(
        False, "--keep-running", help="After the window, let the program run to its end (default: stop it there)."),
    full: bool = typer.Option(
        False, "--full", help="Profile the whole run (default: a window the program picks after warm-up, "
                              "then it is stopped; see docs/run.md)."),
    capture_mode: str = typer.Option(
        "auto", "--capture-mode",
        help="How the window is cut: cuda (cudaProfilerApi), nvtx, or auto (cuda when the program's torch has "
             "CUDA and a GPU is present, else nvtx)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script or module (default: this one)."),
    no_autotrace: bool = typer.Option(False, "--no-autotrace", help="Run without nvtx_autotrace's ranges."),
    autotrace_depth: Optional[str] = typer.Option(
        None, "--autotrace-depth",
        help="Module range depth: auto (default: chosen to cost <= --autotrace-budget), N, or -1 (all; costly)."),
    autotrace_budget: Optional[float] = typer.Option(
        None, "--autotrace-budget", help="With depth auto: module ranges may cost this % of a step (default 0.5)."),
    trace: Optional[str] = typer.Option(
        None, "--trace", "-t",
        help="nsys -t list (default: cuda,nvtx, what the analysis reads; add e.g. osrt,cudnn,cublas for the GUI)."),
    nsys_args: Optional[str] = typer.Option(
        None, "--nsys-args", help='Extra nsys profile options, e.g. "--sample=process-tree".'),
    nsys: Optional[str] = typer.Option(None, "--nsys", help="nsys binary or install folder (default: $NSYS, PATH)."),
    min_gap_ms: float = typer.Option(1.0, "--min-gap-ms", help="Smallest GPU idle gap to report, in ms."),
    html_max_points: int = typer.Option(
        20_000, "--html-max-points", help="Drawing budget of summary.html; bigger traces are aggregated."),
    per_rank: bool = typer.Option(
        False, "--per-rank", help="With -- torchrun ...: one nsys per rank inside torchrun, one report per rank "
                                  "(rank0.nsys-rep, ...), analyzed together (default: one report for the node)."),
    history_path: Optional[Path] = shared_options.history(),
    no_history: bool = shared_options.no_history(),
    try_knobs: Optional[str] = typer.Option(
        None, "--try", metavar="KNOB=VALUE,...",
        help="Profile with these knobs applied, without editing the script (as nvtx-trace try does; docs/try.md), "
             'e.g. --try "num_workers=8,pin_memory=1".'),
) -> int:
    """Profile a training script under Nsight Systems with automatic NVTX ranges, then
    print why the GPU idles and write report.nsys-rep, report.sqlite, summary.json and
    summary.html into a fresh folder (nsys's own messages go to nsys.log there; the
    program's output comes through unchanged). nvtx-trace exits with the program's exit code.
    By default the program picks its window: after warm-up (once the step pace settles), at least 20
    steps and 5 s, then it is stopped; --full profiles the whole run, --warmup-steps/--steps a fixed window.

    Examples: nvtx-trace run train.py --epochs 1 | nvtx-trace run --full train.py |
    nvtx-trace run --warmup-steps 10 --steps 20 -m mypkg.train |
    nvtx-trace run -- torchrun --nproc_per_node=2 train.py |
    nvtx-trace run --per-rank -- torchrun --nproc_per_node=2 train.py
    """
    from nvtx_trace.capture import interrupts
    from nvtx_trace.cli.own_options import refuse_unknown
    from nvtx_trace.runner.run_verb import RunRequest, run_profile

    refuse_unknown(ctx, target, "run")
    with interrupts.Guard():  # SIGINT, SIGTERM, SIGHUP from here on: nothing started outlives the run (docs/run.md)
        options = _options(target, module, out, force, warmup_steps, steps, keep_running, full, capture_mode, python,
                           no_autotrace, autotrace_depth, autotrace_budget, trace, nsys_args, nsys, min_gap_ms,
                           html_max_points, per_rank, try_knobs)
        return run_profile(RunRequest(options, history_path=history_path, no_history=no_history))


def _options(target, module, out, force, warmup_steps, steps, keep_running, full, capture_mode, python, no_autotrace,
             autotrace_depth, autotrace_budget, trace, nsys_args, nsys, min_gap_ms, html_max_points, per_rank,
             try_knobs) -> RunOptions:
    """The run's options from the command line's, each refused in one line that names it."""
    from nvtx_trace import knobs as declared
    from nvtx_trace.errors import UsageError
    from nvtx_trace.runner.plan import RunOptions

    try:
        tried = declared.parse(try_knobs) if try_knobs is not None else None
    except ValueError as exc:
        raise UsageError(f"--try {exc}") from None
    if try_knobs is not None and not tried:
        raise UsageError('--try needs at least one KNOB=VALUE, e.g. --try "num_workers=8"')
    if trace is not None and not [t for t in trace.split(",") if t.strip()]:
        raise UsageError(f"--trace {trace!r} names nothing to trace; e.g. --trace cuda,nvtx (the default)")
    try:
        extra_nsys_args = shlex.split(nsys_args) if nsys_args else []
    except ValueError as exc:
        raise UsageError(f"--nsys-args {nsys_args!r}: {exc}; quote it as a shell would, "
                         "e.g. --nsys-args \"--sample=process-tree\"") from None
    return RunOptions(
        target=list(target or []), module=module, python=python, autotrace=not no_autotrace,
        warmup_steps=warmup_steps, steps=steps, capture_mode=capture_mode, keep_running=keep_running, full=full,
        trace=[t for t in trace.split(",") if t] if trace else None,
        nsys_args=extra_nsys_args, out=out, force=force, nsys=nsys,
        min_gap_ms=min_gap_ms, html_max_points=html_max_points, autotrace_depth=autotrace_depth,
        autotrace_budget=autotrace_budget, per_rank=per_rank, tried=tried)
