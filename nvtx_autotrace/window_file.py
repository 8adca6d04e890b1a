"""The decisions file the runner reads after the program (``$NVTX_AUTOTRACE_WINDOW_FILE``): one JSON line per
event (the window opened or closed, the program ended, try's first losses). Its own module: the capture window,
the default window and the losses all write it, and none of them imports another for it."""

from __future__ import annotations

import json
import os

from nvtx_trace import names

FILE_ENV = names.WINDOW_FILE_ENV


def note(event: str, **fields) -> None:
    """Append one event; nothing when the runner gave no file, and never an error into the program."""
    path = os.environ.get(FILE_ENV)
    if not path:
        return
    try:
        with open(path, "a") as fh:
            fh.write(json.dumps({"event": event, "pid": os.getpid(), "rank": os.environ.get("RANK"), **fields}) + "\n")
    except OSError:
        pass
