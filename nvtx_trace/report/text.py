"""Terminal summary: the biggest recoverable time first, then the fix, in a screenful.

Each question's part is its own ``text`` (analyzer/questions/); this module only frames them.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from nvtx_trace.report import skipped_by_reason
from nvtx_trace.report.sections import printable, text_sections


def render(analysis, console: Console) -> None:
    ranks = analysis.ranks
    shown = escape(printable(analysis.path if not ranks else f"{len(ranks)} reports merged ({ranks[0]['report']} ...)"))
    console.print(f"[bold]nvtx-trace[/bold] {shown}  (nsys {analysis.nsys_version or '?'}, export schema "
                  f"{analysis.schema_version or '?'})")
    text_sections(analysis, console)
    for why, names in skipped_by_reason(analysis.skipped).items():
        console.print(f"[yellow]skipped[/yellow] {', '.join(names)}: {escape(printable(why))}", highlight=False)
    for w in analysis.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(printable(w))}", highlight=False)
