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
