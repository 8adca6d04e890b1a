"""Terminal summary: the biggest recoverable time first, then the fix, in a screenful.

Each analysis unit's part is its ``Section`` (report/sections.py); this module only frames them.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from nvtx_trace.report import skipped_by_reason
from nvtx_trace.report.sections import SECTIONS


def render(a, console: Console) -> None:
    console.print(f"[bold]nvtx-trace[/bold] {a.path}  (nsys {a.nsys_version or '?'}, export schema "
                  f"{a.schema_version or '?'})")
    for section in SECTIONS.values():
        if section.text is not None:
            section.text(a, console)
    for why, names in skipped_by_reason(a.skipped).items():
        console.print(f"[yellow]skipped[/yellow] {', '.join(names)}: {escape(why)}", highlight=False)
    for w in a.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)
