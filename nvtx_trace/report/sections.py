"""The views questions draw on: a terminal view over a rich Console and an HTML view over html_table.

What each question shows is its own (``Question.text`` / ``Question.html``); the terminal and HTML
renderers walk ``questions.text_sections()`` / ``html_sections()`` in their declared reading order and
give each one of these views.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from nvtx_trace.report.html_table import table

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0))}
_CONTROL.update({0x0a: "\\n", 0x0d: "\\r", 0x09: "\\t"})


def printable(text) -> str:
    """Names from a report (kernels, ranges, threads, paths) shown, never obeyed: an escape sequence that would
    clear the screen or retitle the window, or a newline that would forge a line of ours, is printed as its
    escape (``\\x1b``, ``\\n``)."""
    return str(text).translate(_CONTROL)


class TextView:
    """``views.TextView`` over a rich Console: every line a question prints goes through ``printable``."""

    def __init__(self, console):
        self.console = console

    def print(self, *parts, **options) -> None:
        self.console.print(*(printable(p) if isinstance(p, str) else p for p in parts), **options)

    def table(self, title: str, columns: list[tuple[str, str]], rows: list[list[str]]) -> None:
        t = Table(title=printable(title), title_justify="left", show_edge=False)
        for name, justify in columns:
            t.add_column(printable(name), justify=justify)
        for row in rows:
            t.add_row(*(printable(c) if isinstance(c, str) else c for c in row))
        self.console.print(t)

    @staticmethod
    def escape(text: str) -> str:
        return escape(printable(text))

    def item(self, marker: str, *lines: str) -> None:
        """Every wrapped line under the item's text, at any width (no trailing blanks: logs and pipes read it)."""
        from rich.text import Text

        indent = len(marker) + 1
        width = max(20, self.console.width - indent)
        for i, line in enumerate(lines):
            for j, part in enumerate(Text.from_markup(printable(line)).wrap(self.console, width)):
                part.rstrip()
                head = printable(marker) + " " if i == 0 and j == 0 else " " * indent
                self.console.print(Text(head) + part, soft_wrap=True, highlight=False)


class HtmlView:
    """``views.HtmlView``: capped HTML tables whose cells carry their units."""

    @staticmethod
    def table(df, title: str, columns: dict[str, str], explain: str = "", folder: str | None = None) -> str:
        return table(df, title, columns, explain, folder)


def text_sections(analysis, console) -> None:
    from nvtx_trace.analyzer.questions import text_sections

    view = TextView(console)
    for q in text_sections():
        q.text(analysis, view)


def html_tables(analysis, d: dict) -> str:
    """The page's Details: every question's tables in reading order, then the notes on the report."""
    from nvtx_trace.analyzer.questions import html_sections
    from nvtx_trace.report import skipped_by_reason
    from nvtx_trace.report.html_table import esc

    parts = [q.html(analysis, d, HtmlView) for q in html_sections()]
    notes = "".join(f"<li><b>skipped {esc(', '.join(names))}</b>: {esc(why)}</li>"
                    for why, names in skipped_by_reason(d["skipped"]).items())
    notes += "".join(f"<li><b>warning</b>: {esc(w)}</li>" for w in d["warnings"])
    if notes:
        parts.append(f"<h3>Notes on this report</h3><ul class='notes'>{notes}</ul>")
    return "".join(parts) or "<p class='muted'>No kernel, copy or sync data in this report.</p>"
