"""Terminal summary: the biggest recoverable time first, then the fix, in a screenful.

Each question's part is its own ``text`` (analyzer/questions/); this module only frames them.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from nvtx_trace.report import skipped_by_reason
from nvtx_trace.report.sections import printable, text_sections


def render(a, console: Console) -> None:
    shown = escape(printable(a.path if not a.ranks else f"{len(a.ranks)} reports merged ({a.ranks[0]['report']} ...)"))
    console.print(f"[bold]nvtx-trace[/bold] {shown}  (nsys {a.nsys_version or '?'}, export schema "
                  f"{a.schema_version or '?'})")
    text_sections(a, console)
    for why, names in skipped_by_reason(a.skipped).items():
        console.print(f"[yellow]skipped[/yellow] {', '.join(names)}: {escape(printable(why))}", highlight=False)
    for w in a.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(printable(w))}", highlight=False)
