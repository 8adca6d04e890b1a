"""`nvtx-trace analyze REPORT`: findings on the terminal, optionally JSON and HTML files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from nvtx_trace.analyzer.options import parse_options
from nvtx_trace.errors import BadReportError, UsageError
from nvtx_trace.files import check_json_html, check_outputs, describe_unreadable, write_atomically
from nvtx_trace.report.console import console


def analyze(
    reports: list[str] = typer.Argument(
        ..., metavar="REPORT",
        help="Nsight Systems export: .sqlite, or .nsys-rep/.qdrep (needs nsys). Several (one per rank), a folder "
             "of them or a quoted glob ('out/rank*.sqlite') are merged into one analysis."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="PATH",
                                           help="Write the JSON summary to PATH ('-' for stdout)."),
    html_out: Optional[str] = typer.Option(None, "--html", metavar="PATH", help="Write the HTML summary to PATH."),
    min_gap_ms: float = typer.Option(1.0, "--min-gap-ms", help="Smallest GPU idle gap to report, in ms."),
    loader_pattern: Optional[str] = typer.Option(
        None, "--loader-pattern", help="Regex of user NVTX ranges that mean 'waiting for the next batch'."),
    step_range: Optional[str] = typer.Option(
        None, "--step-range", metavar="REGEX",
        help="NVTX ranges that are the training steps (your own, e.g. '^train_step$'); default: `step N` ranges, "
             "else steps inferred from the kernel sequence."),
    warmup_steps: Optional[int] = typer.Option(
        None, "--warmup-steps", help="Steps to leave out of the steady state (default: detected)."),
    nsys: Optional[str] = typer.Option(None, "--nsys", metavar="PATH", help="nsys to export a .nsys-rep with."),
    html_max_points: int = typer.Option(
        20_000, "--html-max-points", help="Drawing budget of the HTML timeline; bigger traces are aggregated."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite existing output files."),
    workers: Optional[int] = typer.Option(
        None, "--workers", metavar="N", help="Processes reading several reports at once (default: one per core)."),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", metavar="ADDRESS",
        help="Read several reports on a Dask cluster: its scheduler's address (tcp://HOST:PORT; the workers must "
             "see the same files) or local:N for N local worker processes (needs nvtx-trace[dask])."),
) -> None:
    """Find why the GPU idles in an Nsight Systems report, and what to change.

    Example: nvtx-trace analyze sample_reports/resnet_flawed_user.sqlite --json out.json

    One report per rank: nvtx-trace analyze out/rank0.sqlite out/rank1.sqlite (or out/, or 'out/rank*.sqlite')
    """

    from nvtx_trace.analyzer import analyze as run_analysis
    from nvtx_trace.report import json as json_report
    from nvtx_trace.report import text

    if html_max_points < 100:
        raise UsageError(f"--html-max-points must be at least 100 (got {html_max_points})")
    options = parse_options(min_gap_ms, loader_pattern, warmup_steps, step_range, scheduler, workers)
    from nvtx_trace.analyzer.ranks.inputs import expand
    from nvtx_trace.capture.export import as_sqlite

    check_json_html(json_out, html_out)
    paths = expand(reports)
    for report in paths:
        problem = describe_unreadable(report)
        if problem:
            raise BadReportError(f"{report} {problem}; pass the report file itself")
    outputs = [Path(p) for p in (json_out, html_out) if p and str(p) != "-"]
    check_outputs(outputs, [*map(Path, reports), *paths], force)  # a folder given is an input as a whole
    err = console(stderr=True)
    what = "Analyzing…" if len(paths) == 1 else f"Analyzing {len(paths)} reports…"
    with err.status(what, spinner="dots"):
        result = run_analysis([as_sqlite(p, nsys) for p in paths], options=options)
    # Files first: a closed stdout (`| head -1`) must not cost the user the files they asked for.
    if json_out and json_out != "-":
        write_atomically(json_out, json_report.render(result))
        err.print(f"Wrote {json_out}")
    if html_out:
        from nvtx_trace.report import html

        html.write(result, Path(html_out), max_points=html_max_points)
        err.print(f"Wrote {html_out}")
    if json_out == "-":
        sys.stdout.write(json_report.render(result))
        sys.stdout.flush()
    else:
        text.render(result, console())
