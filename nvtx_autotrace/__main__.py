"""``python -m nvtx_autotrace train.py args...``: install, then run the script as ``__main__``.

For profiling a script you cannot or will not edit. ``-m module`` runs a module
instead of a file, like ``python -m``.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

USAGE = "usage: python -m nvtx_autotrace [-m module | script.py] [args...]"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\nRuns the program with NVTX ranges installed (see docs/autotrace.md).",
              file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    import nvtx_autotrace

    nvtx_autotrace.install()  # idempotent; importing already installed it
    sys.excepthook = _interrupt_without_our_frames(sys.excepthook)
    if argv[0] == "-m" and len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            # like `python script.py`: the script's folder first (cwd stays, for spawned workers)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # as Python itself reports it, without our and runpy's frames in front
        tb = _from_the_program(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the hook prints the exception's own traceback
        return 1
    return 0


def _interrupt_without_our_frames(hook):
    """A Ctrl-C lands wherever the program is, often inside our wrappers (a module's forward, a DataLoader's
    next): its traceback is the program's own, printed without our and runpy's frames (45 lines of them were)."""
    def without(kind, exc, tb):
        if issubclass(kind, KeyboardInterrupt):
            kept = []
            while tb is not None:
                if not _ours(tb.tb_frame):
                    kept.append(tb)
                tb = tb.tb_next
            tb = None
            for t in reversed(kept):
                tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
            exc = exc.with_traceback(tb)  # Python prints the exception's own traceback, not the one passed
        return hook(kind, exc, tb)

    return without


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _ours(frame) -> bool:
    """A frame of runpy's (frozen, named by its module) or of nvtx_autotrace's, not the program's."""
    return frame.f_globals.get("__name__") == "runpy" or os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE)


def _from_the_program(tb):
    """The traceback from the program's first frame on: runpy's and this package's frames before it are ours."""
    while tb is not None and tb.tb_next is not None and _ours(tb.tb_frame):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    sys.exit(main())
