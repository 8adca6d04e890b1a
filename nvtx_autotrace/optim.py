"""Optimizer ``step`` and ``zero_grad`` ranges, and the step boundary.

Subclasses override ``step``, so the base method cannot be wrapped; PyTorch's
global step pre/post hooks run around every subclass's ``step`` instead.
``zero_grad`` is rarely overridden, so the base method is wrapped.
"""

from __future__ import annotations

import threading
from typing import Callable

from nvtx_autotrace import _backend, _registry, memory, steps
from nvtx_autotrace._compile import compiling
from nvtx_trace import names

_tls = threading.local()


def install(emit_ranges: bool, note_zero_grad: Callable[[tuple, dict], None] | None = None) -> None:
    import torch.optim
    from torch.optim import optimizer as opt_mod

    def pre(optimizer, args, kwargs) -> None:
        if compiling():
            return
        steps.touch()
        if emit_ranges:
            memory.at_phase("optimizer")
            stack = _tls.__dict__.setdefault("open", [])
            stack.append(optimizer)
            _backend.push(names.optimizer_step(type(optimizer).__name__))
            return _traced_closure(optimizer, args, kwargs)
        return None

    def post(optimizer, args, kwargs) -> None:
        if compiling():
            return
        if emit_ranges:
            stack = _tls.__dict__.get("open")
            if stack and stack[-1] is optimizer:
                stack.pop()
                _backend.pop()
        if steps.is_lead(optimizer):
            steps.boundary()

    guard = _registry.Guard("optimizer.step")
    h1 = opt_mod.register_optimizer_step_pre_hook(guard.hook(pre))
    h2 = opt_mod.register_optimizer_step_post_hook(guard.hook(post))
    _registry.on_undo(h1.remove)
    _registry.on_undo(h2.remove)

    if emit_ranges or note_zero_grad:
        def make_zero_grad(original):
            def zero_grad(self, *args, **kwargs):
                if compiling():
                    return original(self, *args, **kwargs)
                if note_zero_grad:
                    note_zero_grad(args, kwargs)
                if not emit_ranges:
                    return original(self, *args, **kwargs)
                _backend.push(names.zero_grad(type(self).__name__))
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _backend.pop()

            return zero_grad

        _registry.patch(torch.optim.Optimizer, "zero_grad", make_zero_grad)


def _traced_closure(optimizer, args: tuple, kwargs: dict):
    """``step(closure)`` runs forward, loss and backward inside the optimizer's step (Lightning's automatic
    optimization, LBFGS): a range of their own around the closure, so that time is not the optimizer's.
    Returns the hook's (args, kwargs) with the closure wrapped, or None when there is none."""
    closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (the optimizer, closure, ...)
    if not callable(closure):
        return None
    name = names.optimizer_closure(type(optimizer).__name__)

    def traced_closure(*a, **k):
        _backend.push(name)
        try:
            return closure(*a, **k)
        finally:
            _backend.pop()

    if "closure" in kwargs:
        return args, {**kwargs, "closure": traced_closure}
    return (args[0], traced_closure, *args[2:]), kwargs
