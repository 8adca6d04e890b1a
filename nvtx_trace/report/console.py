"""The console every command prints through.

A terminal keeps its own width. A log file or a pipe has none, and rich then wraps at 80 columns: a GPU's name
went over three lines and ``try``'s table was cut to ``roun…``. Output that is not a terminal gets WIDE columns
instead, unless ``COLUMNS`` says otherwise.
"""

from __future__ import annotations

import os
import sys

WIDE = 160


def console(stderr: bool = False, **options):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced
        terminal = False
    if not terminal and not os.environ.get("COLUMNS"):
        options.setdefault("width", WIDE)
    return Console(stderr=stderr, **options)


NARROW = 110  # below this many columns a wide table is printed as one block per row


def table_or_blocks(console, table, title: str, columns: list[str], rows: list[list[str]]) -> None:
    """``table`` where the terminal is wide enough; below NARROW columns, one block per row (its first cell,
    then each other cell under its column's name), so no cell is cut and no word split (80 columns cut every
    cell of try's table to ``116.32…`` and split tune's words)."""
    if console.width >= NARROW:
        console.print(table)
        return
    console.print(title, soft_wrap=True, markup=False, highlight=False)
    for row in rows:
        console.print(f"- {columns[0]}: {row[0]}", soft_wrap=True, markup=False, highlight=False)
        for name, cell in zip(columns[1:], row[1:]):
            if cell not in ("", None):
                console.print(f"    {name}: {cell}", soft_wrap=True, markup=False, highlight=False)


def framing(console, text: str, style: str | None = None) -> None:
    """One of the tool's own lines (what it profiles, the nsys command): on a terminal, wrapped at words with the
    rest indented (the nsys command ended 300-400 characters on; at 80 columns it broke mid-word); elsewhere one
    line, as logs and greps want."""
    from rich.text import Text

    if not console.is_terminal:
        console.print(text, soft_wrap=True, markup=False, highlight=False, style=style)
        return
    for i, part in enumerate(Text(text).wrap(console, max(20, console.width - 4))):
        part.rstrip()
        console.print(Text("    " if i else "") + part, soft_wrap=True, highlight=False, style=style)


def command_lines(argv: list[str], width: int) -> list[str]:
    """A command as a shell takes it, cut into lines of at most ``width`` with `` \\`` continuations (copy and
    paste runs it)."""
    import shlex

    lines, line = [], "$"
    for word in (shlex.quote(w) for w in argv):
        if len(line) + 1 + len(word) + 2 > width and line not in ("$", "   "):
            lines.append(line + " \\")
            line = "   "
        line += " " + word
    return lines + [line]
