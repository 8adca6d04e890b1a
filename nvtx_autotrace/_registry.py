"""Every change nvtx_autotrace makes to torch, recorded so ``uninstall()`` can undo it exactly.

An attribute that a class only inherited (``Tensor.to`` comes from ``TensorBase``)
is deleted again on undo rather than set, so ``vars(cls)`` looks as it did before.
Hook handles (module, optimizer) are undone with ``remove()``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

_MISSING = object()
_undo: list[Callable[[], None]] = []
_warned: set[str] = set()
PATCHED_MARK = "__nvtx_autotrace_original__"


def patch(owner: Any, attr: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.attr`` by ``make(original)`` (wrapped with functools.wraps)."""
    own = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
    original = getattr(owner, attr)
    if getattr(original, PATCHED_MARK, None) is not None:
        return  # already ours (a second install would stack wrappers)
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, PATCHED_MARK, original)
    setattr(owner, attr, wrapper)

    def undo() -> None:
        if own is _MISSING:
            try:
                delattr(owner, attr)
            except AttributeError:
                pass
        else:
            setattr(owner, attr, own)

    _undo.append(undo)


def on_undo(fn: Callable[[], None]) -> None:
    """Run ``fn`` at uninstall (hook handles' ``remove``, state resets)."""
    _undo.append(fn)


def undo_all() -> None:
    while _undo:
        _undo.pop()()


def count() -> int:
    return len(_undo)


def warn_once(key: str, message: str) -> None:
    """One warning per kind of problem per process: a training loop must not flood stderr."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"nvtx_autotrace: {message}", RuntimeWarning, stacklevel=3)
