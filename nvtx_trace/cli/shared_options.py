"""The options run, try and tune share (their outputs folder, --force, the run history): declared once, so the three
verbs say the same words and take the same values."""

from __future__ import annotations

import typer


def out(name: str):
    """``--out``: ``name`` is the default folder's name pattern under ./nvtx-trace-out/."""
    return typer.Option(None, "--out", "-o", help=f"Folder for the outputs (default: ./nvtx-trace-out/{name}/).")


def force(what: str = "an --out folder or --json file that exists"):
    return typer.Option(False, "--force", "-f", help=f"Allow {what}.")


def history():
    return typer.Option(None, "--history", help="Run history database (default: $NVTX_TRACE_HISTORY, else the "
                                                "platform's data folder; see nvtx-trace history).")


def no_history():
    return typer.Option(False, "--no-history", help="Record nothing in the run history.")
