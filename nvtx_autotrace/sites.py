"""The line of the user's code that called into torch: ``train.py:87``.

The first frame outside torch and nvtx_autotrace: the user's, or a framework's own where the framework made the
call (Lightning's logging, a Trainer's loss accounting). A call nvtx_autotrace makes itself (its capture window's
synchronize) has no such line. Each line's text is made once and kept: the path from the current folder where the
file is under it (``train.py:87``, ``src/loop.py:12``), from its package's root where it is installed
(``lightning/pytorch/core/module.py:512``), else whole. A framework's generic helpers (its ``utilities``) are
passed over for the framework line that called them. NVTX_AUTOTRACE_SITES=0 names no line (to measure the cost).

A ranged module's first call notes the line that called it (``module_sites``, written with the settings record):
a finding about one module's kernels (layout transposes) can then say where in the program that module runs.
"""

from __future__ import annotations

import os
import sys

import torch

from nvtx_trace import names

_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_NOT_THE_CALLER = (os.path.dirname(torch.__file__) + os.sep, _OURS)
_REGISTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_registry.py")
_texts: dict[tuple, str] = {}  # (code object, line) -> "file:line"
MAX_LINES = 4096  # distinct lines kept; beyond, none is named (a generated loop would grow the table for ever)
OURS = object()  # the caller is nvtx_autotrace itself
ENABLED = os.environ.get("NVTX_AUTOTRACE_SITES", "1").strip() != "0"
_modules: dict[str, str] = {}  # "layer1.0.conv1 (Conv2d)" -> "file:line" of its first call
MAX_MODULES = 1024  # the settings record stays small on a model of thousands of modules
_PACKAGE_ROOTS = tuple(sorted({p.rstrip(os.sep) + os.sep for p in sys.path if p.endswith(("site-packages", "dist-packages"))},
                              key=len, reverse=True))


def shown(filename: str) -> str:
    """A file as a user finds it: an installed package's from its package's root (wherever its environment lives:
    a virtual environment inside the project gave ``.venv/lib/python3.11/site-packages/lightning/...``), else
    from the current folder, else its whole path."""
    path = os.path.abspath(filename)
    for root in _PACKAGE_ROOTS:
        if path.startswith(root):
            return path[len(root):]
    here = os.getcwd() + os.sep
    if path.startswith(here):
        return path[len(here):]
    return path


_HELPER_FOLDERS = (os.sep + "utilities" + os.sep, os.sep + "utils" + os.sep, "_utilities" + os.sep)
_helpers: dict = {}  # code object -> whether it is an installed framework's generic helper


def _is_helper(code) -> bool:
    """A function in an installed package's utilities (Lightning's ``apply_to_collection`` calling ``.item()``
    for its logger, ``move_data_to_device``'s copy): its line names no decision; the framework line that called
    it does. The user's own files are never skipped."""
    known = _helpers.get(code)
    if known is None:
        name = code.co_filename
        known = _helpers[code] = name.startswith(_PACKAGE_ROOTS) and any(f in name for f in _HELPER_FOLDERS)
    return known


def caller(depth: int = 2):
    """``file:line`` of the caller ``depth`` frames up from the function that asks, past torch's and our own
    frames; OURS where that caller is nvtx_autotrace; None where no line can be named."""
    if not ENABLED:
        return None
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
    first = frame
    while frame is not None and _is_helper(frame.f_code):  # a framework's apply_to_collection: its caller says more
        frame = frame.f_back
    frame = frame or first
    key = (frame.f_code, frame.f_lineno)
    text = _texts.get(key)
    if text is None:
        if len(_texts) >= MAX_LINES:
            return None
        text = _texts[key] = f"{shown(frame.f_code.co_filename)}:{frame.f_lineno}"
    return text


def note_module(forward_range: str, depth: int) -> bool:
    """Note the line that called a module (its range name ``forward PATH (Class)``): the first frame outside torch
    from ``depth`` frames above the function that asks. True: noted, or never to be (asked once per module)."""
    if not forward_range.startswith(names.FORWARD_PREFIX):  # the budget's calibration probes: not the program's
        return True
    label = forward_range[len(names.FORWARD_PREFIX):]
    if label not in _modules and len(_modules) < MAX_MODULES:
        where = caller(depth + 2)
        if isinstance(where, str):
            _modules[label] = where
    return True


def module_sites() -> dict[str, str]:
    """``{"layer1.0.conv1 (Conv2d)": "torchvision/models/resnet.py:92"}`` for the ranged modules called so far."""
    return dict(_modules)


def forget_modules() -> None:
    _modules.clear()
