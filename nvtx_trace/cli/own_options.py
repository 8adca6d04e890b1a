"""run, try and tune pass everything after the script to it unchanged, so a mistyped option of ours lands where the
script belongs: said as click says it for the other verbs (``No such option: --budgt (Possible options:
--budget)``), before anything runs, instead of a puzzle about a command or a script."""

from __future__ import annotations

import difflib

from nvtx_trace.errors import UsageError

PROGRAM_WORDS = ("-m", "--")  # how a module or a command is given: not options of ours


def refuse_unknown(ctx, target: list[str] | None, verb: str) -> None:
    """One line where the first word of the target is an option this verb does not have."""
    if not target or not target[0].startswith("-") or target[0] in PROGRAM_WORDS or target[0] == "-":
        return
    word = target[0].split("=", 1)[0]
    names = sorted({o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")})
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.75)
    hint = f" (Possible options: {', '.join(close)})" if close else ""
    raise UsageError(f"No such option: {word}{hint}; the options of nvtx-trace {verb} come before the script (see "
                     f"nvtx-trace {verb} --help)")
