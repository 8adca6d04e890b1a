"""`nvtx-trace diff BEFORE AFTER`: what a change did to the step time and to each finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from nvtx_trace.files import check_json_html, check_outputs, write_atomically
from nvtx_trace.report.console import console


def diff(
    before: Path = typer.Argument(..., metavar="BEFORE", help="Report, summary.json or run folder before the change."),
    after: Path = typer.Argument(..., metavar="AFTER", help="The same, after the change."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="PATH", help="Write the diff as JSON ('-': stdout)."),
    html_out: Optional[str] = typer.Option(None, "--html", metavar="PATH", help="Write the diff as one HTML page."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite existing output files."),
) -> None:
    """Compare two runs: steady step medians, GPU busy, each finding resolved / improved / unchanged /
    worse / new, and the first run's predicted step beside the one measured after.

    Example: nvtx-trace diff nvtx-trace-out/train-20261123-101500 nvtx-trace-out/train-20261123-103200
    """

    from nvtx_trace.report import diff_render
    from nvtx_trace.runner.diff import compare, load_summary, refuse_same_run

    check_json_html(json_out, html_out)
    refuse_same_run(before, after)
    outputs = [Path(p) for p in (json_out, html_out) if p and str(p) != "-"]
    check_outputs(outputs, [before, after], force)
    result = compare(load_summary(before), load_summary(after))
    if json_out and json_out != "-":
        write_atomically(json_out, json.dumps(result, indent=1))
    if html_out:
        write_atomically(Path(html_out), diff_render.html(result))
    if json_out == "-":
        print(json.dumps(result, indent=1))
    else:
        diff_render.text(result, console())
