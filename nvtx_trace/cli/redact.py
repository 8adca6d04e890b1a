"""`nvtx-trace redact REPORT -o OUT`: a shareable copy of an export, without the machine's secrets.

Thin on purpose: the rules live in ``nvtx_trace.runner.redact``; this only picks the
output name, prints what was removed and where the copy went.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer


def default_output(report: Path) -> Path:
    """``run.sqlite`` -> ``run.redacted.sqlite``, next to the input."""
    return report.with_name(f"{report.stem}.redacted{report.suffix or '.sqlite'}")


def redact(
    report: Path = typer.Argument(..., metavar="REPORT", help="Nsight Systems SQLite export (nsys export --type sqlite)."),
    out: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Where to write the redacted copy (default: REPORT.redacted.sqlite)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite OUT if it exists."),
) -> None:
    """Write a copy of REPORT without environment variables, host/user names, paths,
    command-line arguments or captured program output; analysis results stay identical but for the paths
    in them, cut to basenames.

    Example: nvtx-trace redact run.sqlite -o run.shareable.sqlite
    """
    from nvtx_trace.runner.redact import redact as redact_report

    out = out or default_output(report)
    summary = redact_report(report, out, force=force)
    for line in summary.lines():
        print(line)
    print(f"Wrote {out}", file=sys.stderr)
