"""The training-step counter, ``step N`` ranges and step-boundary callbacks.

A step ends when the *lead* optimizer (the first one whose ``step()`` ran and is
still alive) finishes its ``step()``; the next step starts at that very moment,
so per-iteration work after the optimizer (``loss.item()`` logging, scheduler
steps) belongs to the step it follows. Step 0 starts at the first sign of
training (first batch wait, root module forward, backward or optimizer step).

``step N`` is a start/end range, not push/pop: its boundaries fall inside other
ranges (the optimizer's, or a user's ``with nvtx.annotate("optimizer")``), and
a push/pop range opened there would be closed by the user's pop. Start/end ranges
need no nesting. The last step is left open when the program ends (nsys keeps
the ranges that ended), so an evaluation loop after training is no fake step.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

from nvtx_autotrace import _backend
from nvtx_trace import names

_lock = threading.Lock()
_step = 0  # index of the running (or next) step == optimizer steps completed
_range = None  # open `step N` range handle
_emit = False  # emit `step N` ranges (option `steps`)
_active = False  # count at all (off in DataLoader workers)
_lead = None  # weakref to the lead optimizer
_callbacks: list[Callable[[int], None]] = []
_starting: list[Callable[[], None]] = []  # called once, at the first sign of training


def current_step() -> int:
    """Index of the step in progress (0 before the first optimizer step ended)."""
    return _step


def on_step_boundary(fn: Callable[[int], None]) -> Callable[[], None]:
    """Call ``fn(n)`` when step ``n`` begins (n >= 1), right after step n-1's optimizer step.

    Runs on the training thread, between the end of one `step` range and the start of
    the next, so a callback that starts or stops a capture (cudaProfilerStart/Stop)
    cuts the timeline exactly at a step boundary. Returns a function that unregisters it.
    """
    _callbacks.append(fn)
    return _remover(_callbacks, fn)


def _remover(registered: list, fn) -> Callable[[], None]:
    def remove() -> None:
        try:
            registered.remove(fn)
        except ValueError:
            pass

    return remove


def on_step_boundary_once(n: int, fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` once, when step ``n`` begins. Returns a function that unregisters it."""
    def once(m: int) -> None:
        if m == n:
            remove()
            fn()

    remove = on_step_boundary(once)
    return remove


def on_training_start(fn: Callable[[], None]) -> Callable[[], None]:
    """Call ``fn()`` once, at the first sign of training (step 0 begins). Returns a function that unregisters it."""
    _starting.append(fn)
    return _remover(_starting, fn)


def _training_started() -> None:
    for fn in list(_starting):
        try:
            _starting.remove(fn)
        except ValueError:
            continue
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the training step must go on
            _drop_callback(fn, exc)


def configure(active: bool, emit: bool) -> None:
    global _active, _emit
    _active, _emit = active, emit


def touch() -> None:
    """Training activity seen: open step 0's range if none is open yet (cheap when open)."""
    if _starting and _active:
        _training_started()
    if _range is None and _emit and _active:
        with _lock:
            _open()


def _open() -> None:
    global _range
    if _range is None and _emit:
        _range = _backend.start(names.step(_step))
        _backend.warm(names.step(_step + 1))  # registering at the boundary would leave a gap


def _close() -> None:
    global _range
    if _range is not None:
        handle, _range = _range, None
        _backend.end(handle)


def boundary() -> int:
    """End the running step and start the next one. Returns the new step index.

    Called by the lead optimizer's step post-hook; call it yourself (``mark_step()``)
    in a loop with no optimizer.
    """
    global _step
    if not _active:
        return _step
    if _starting:
        _training_started()
    with _lock:
        if _range is None:
            _open()  # a step with no earlier sign of activity still gets its range
        _close()
        _step += 1
        new = _step
    for fn in list(_callbacks):
        try:
            fn(new)
        except Exception as exc:  # noqa: BLE001 - the training step must go on; this callback is dropped
            _drop_callback(fn, exc)
    with _lock:
        _open()
    return new


def _drop_callback(fn, exc: Exception) -> None:
    from nvtx_autotrace import _registry

    try:
        _callbacks.remove(fn)
    except ValueError:
        pass
    _registry.warn_once(f"boundary-{getattr(fn, '__qualname__', fn)}",
                        f"a step-boundary callback failed and was switched off ({type(exc).__name__}: {exc}); "
                        "the program runs on")


def is_lead(optimizer) -> bool:
    """True for the optimizer whose steps count (first to step, while it lives)."""
    global _lead
    lead = _lead() if _lead is not None else None
    if lead is None:
        _lead = weakref.ref(optimizer)
        return True
    return lead is optimizer


def lead_optimizer():
    """The optimizer whose steps count, or None (no step yet, or it was freed)."""
    return _lead() if _lead is not None else None


def reset(step: int = 0) -> None:
    """Forget the open range and the lead optimizer (uninstall, forked children)."""
    global _step, _range, _lead
    with _lock:
        _step, _range, _lead = step, None, None


def close_open_range() -> None:
    """End the open step range (uninstall: ranges must not outlive the patches)."""
    with _lock:
        _close()
