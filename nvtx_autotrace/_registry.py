"""Every change nvtx_autotrace makes to torch, recorded so ``uninstall()`` can undo it exactly.

An attribute that a class only inherited (``Tensor.to`` comes from ``TensorBase``)
is deleted again on undo rather than set, so ``vars(cls)`` looks as it did before.
Hook handles (module, optimizer) are undone with ``remove()``.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable

_MISSING = object()
_undo: list[Callable[[], None]] = []
_warned: set[str] = set()
_guards: list["Guard"] = []
PATCHED_MARK = "__nvtx_autotrace_original__"


class _UserError:
    """Marks exceptions raised by the user's own code (the original callable) as they pass our wrappers."""

    attr = "__nvtx_autotrace_user__"

    @classmethod
    def mark(cls, exc: BaseException) -> None:
        try:
            setattr(exc, cls.attr, True)
        except (AttributeError, TypeError):
            pass

    @classmethod
    def find(cls, exc: BaseException | None) -> BaseException | None:
        seen = 0
        while exc is not None and seen < 20:  # our cleanup may have raised while the user's error passed
            if getattr(exc, cls.attr, False):
                return exc
            exc, seen = exc.__context__, seen + 1
        return None


def contained(key: str, original: Callable, make: Callable[[Callable], Callable]) -> Callable:
    """``make(original)``, made unable to harm the program: if *our* part of the wrapper raises, the
    wrapper is switched off for good (one warning) and the call completes as the original would.

    The user's own exceptions (from ``original``) pass through untouched; ``original`` never runs twice.
    """
    tls = threading.local()
    state = {"off": False}

    def call_original(*args, **kwargs):
        frame = getattr(tls, "frame", None)
        if frame is not None:
            frame[0] = True  # entered
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            _UserError.mark(exc)
            raise
        if frame is not None:
            frame[1], frame[2] = True, result  # returned
        return result

    inner = make(call_original)

    def guarded(*args, **kwargs):
        if state["off"]:
            return original(*args, **kwargs)
        saved = getattr(tls, "frame", None)  # a recursive call keeps its own frame
        frame = tls.frame = [False, False, None]  # entered, returned, result
        try:
            return inner(*args, **kwargs)
        except BaseException as exc:
            user = _UserError.find(exc)
            if user is exc or isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            state["off"] = True
            warn_once(f"patch-{key}", f"{key} ranges switched off after an internal error "
                                      f"({type(exc).__name__}: {exc}); the program runs on")
            if user is not None:
                raise user from None  # our cleanup failed while the user's own error passed: theirs wins
            if frame[1]:
                return frame[2]
            if frame[0]:
                raise  # entered, neither returned nor marked: treat as the user's, never run it twice
            return original(*args, **kwargs)
        finally:
            tls.frame = saved

    return guarded


class Guard:
    """One instrumentation feature's off switch: its hooks stop at their first internal error (one warning)."""

    def __init__(self, key: str):
        self.key = key
        self.off = False
        _guards.append(self)

    def failed(self, exc: BaseException) -> None:
        self.off = True
        warn_once(f"patch-{self.key}", f"{self.key} ranges switched off after an internal error "
                                       f"({type(exc).__name__}: {exc}); the program runs on")

    def hook(self, fn: Callable) -> Callable:
        """``fn`` (a hook torch calls: it returns None) that can never raise into torch."""
        def hook(*args, **kwargs):
            if self.off:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                self.failed(exc)
                return None

        return hook


def patch(owner: Any, attr: str, make: Callable[[Callable], Callable], contain: bool = True,
          mark: bool = True) -> None:
    """Replace ``owner.attr`` by ``make(original)`` (wrapped with functools.wraps), contained (``contained``).

    ``contain=False`` is for wrappers that only take a note before calling ``original`` once, inside their
    own try/except: on a hot path (``torch.autocast.__enter__``) containment costs more than the note.
    ``mark=False`` leaves the wrapper unmarked, so a range wrapper installed after it wraps it in turn
    (try's knobs: they change what the program does, the ranges then record it)."""
    own = owner.__dict__.get(attr, _MISSING) if isinstance(owner, type) else getattr(owner, attr, _MISSING)
    original = getattr(owner, attr)
    if mark and getattr(original, PATCHED_MARK, None) is not None:
        return  # already ours (a second install would stack wrappers)
    key = f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"
    wrapper = functools.wraps(original)(contained(key, original, make) if contain else make(original))
    if mark:
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
    for guard in _guards:  # a reinstall starts with every feature on again
        guard.off = False


def count() -> int:
    return len(_undo)


def warn_once(key: str, message: str) -> None:
    """One warning per kind of problem per process: a training loop must not flood stderr."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"nvtx_autotrace: {message}", RuntimeWarning, stacklevel=3)
