"""The line of the user's code that called into torch: ``train.py:87``.

The first frame outside torch and nvtx_autotrace: the user's, or a framework's own where the framework made the
call (Lightning's logging, a Trainer's loss accounting). A call nvtx_autotrace makes itself (its capture window's
synchronize) has no such line. Each line's text is made once and kept.
"""

from __future__ import annotations

import os
import sys

import torch

_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NOT_THE_CALLER = (os.path.dirname(torch.__file__) + os.sep, _OURS)
_REGISTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_registry.py")
_texts: dict[tuple, str] = {}  # (code object, line) -> "file:line"
MAX_LINES = 4096  # distinct lines kept; beyond, none is named (a generated loop would grow the table for ever)
OURS = object()  # the caller is nvtx_autotrace itself


def caller(depth: int = 2):
    """``file:line`` of the caller ``depth`` frames up from the function that asks, past torch's and our own
    frames; OURS where that caller is nvtx_autotrace; None where no line can be named."""
    try:
        frame = sys._getframe(depth)
    except ValueError:  # a stack shallower than that: no line to name
        return None
    while frame is not None and frame.f_code.co_filename == _REGISTRY:  # the guard around every wrapper
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(_OURS):
        return OURS
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_THE_CALLER):
        frame = frame.f_back
    if frame is None:
        return None
    key = (frame.f_code, frame.f_lineno)
    text = _texts.get(key)
    if text is None:
        if len(_texts) >= MAX_LINES:
            return None
        text = _texts[key] = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    return text
