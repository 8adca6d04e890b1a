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
    """``run.sqlite`` (or ``run.nsys-rep``) -> ``run.redacted.sqlite``, next to the input."""
    from nvtx_trace.files import stem_of

    return stem_of(report).with_name(f"{stem_of(report).name}.redacted.sqlite")


def redact(
    report: Path = typer.Argument(..., metavar="REPORT", help="Nsight Systems SQLite export (nsys export --type "
                                  "sqlite), or a .nsys-rep (exported first, beside it)."),
    out: Optional[Path] = typer.Option(
        None, "-o", "--output", help="Where to write the redacted copy (default: REPORT.redacted.sqlite)."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite OUT if it exists."),
) -> None:
    """Write a copy of REPORT without environment variables, host/user names, paths,
    command-line arguments or captured program output; analysis results stay identical but for the paths
    in them, cut to basenames.

    Example: nvtx-trace redact run.sqlite -o run.shareable.sqlite
    """
    from nvtx_trace.capture.export import ensure_sqlite
    from nvtx_trace.files import REPORT_SUFFIXES
    from nvtx_trace.report.sections import printable
    from nvtx_trace.runner.redact import redact as redact_report

    out = out or default_output(report)
    source = report
    if report.name.endswith((*REPORT_SUFFIXES, ".qdstrm")):  # exported first, as analyze does (never changed)
        source = ensure_sqlite(report, progress=lambda m: print(f"nvtx-trace: {printable(m)}", file=sys.stderr))
    summary = redact_report(source, out, force=force)
    for line in summary.lines():
        print(line)
    print(f"Wrote {printable(str(out))}", file=sys.stderr)
