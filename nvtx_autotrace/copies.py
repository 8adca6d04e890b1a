"""Host-to-device copies (``Tensor.to`` / ``.cuda()`` / ``copy_``) and ``pin_memory()``.

The range name carries what the analyzer needs to explain a slow copy: its size,
whether the source was pinned (a pageable source makes ``non_blocking`` a lie)
and whether ``non_blocking`` was asked for. Most ``.to`` calls are dtype or
CPU-to-CPU conversions, so the wrapper decides from its arguments alone, before
any expensive call, that a call is not a host-to-device copy.
"""

from __future__ import annotations

import torch

from nvtx_autotrace import _backend, _registry, sites
from nvtx_autotrace._compile import compiling
from nvtx_trace import names


def _device_type(d) -> str | None:
    if isinstance(d, str):
        return d.split(":", 1)[0]
    if isinstance(d, torch.device):
        return d.type
    if isinstance(d, int) and not isinstance(d, bool):
        return "cuda"  # a bare index means the current accelerator
    return None


def target_type(args, kwargs) -> str | None:
    """Device type a ``Tensor.to(*args, **kwargs)`` call moves to, or None if it keeps the device."""
    d = kwargs.get("device") if kwargs else None
    if d is None and args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            return first.device.type
        d = first
    return _device_type(d) if d is not None else None


def _non_blocking_of_to(args, kwargs) -> bool:
    try:
        return bool(torch._C._nn._parse_to(*args, **kwargs)[2])
    except Exception:
        return bool(kwargs.get("non_blocking", False))


def _h2d(src: torch.Tensor, non_blocking: bool) -> str:
    """The copy's range name, with the line that asked for it (the frame above the ``to``/``cuda``/``copy_``
    wrapper that calls this)."""
    try:
        pinned = src.is_pinned()
    except Exception:
        pinned = False
    where = sites.caller(3)
    return names.h2d_copy(src.nbytes, pinned, non_blocking, None if where is sites.OURS else where)


def _ranged(name: str, fn, *args, **kwargs):
    _backend.push(name)
    try:
        return fn(*args, **kwargs)
    finally:
        _backend.pop()


def install(copies: bool = True, syncs: bool = True) -> None:
    """Copies' ranges when ``copies``; ``syncs`` adds ``sync to_cpu`` for blocking ``.to("cpu")``."""
    from nvtx_autotrace.syncs import sync_label

    def make_to(original):
        def to(self, *args, **kwargs):
            if not (args or kwargs) or compiling():
                return original(self, *args, **kwargs)
            kind = self.device.type
            if kind == "cpu":
                if copies and target_type(args, kwargs) == "cuda":
                    return _ranged(_h2d(self, _non_blocking_of_to(args, kwargs)), original, self, *args, **kwargs)
            elif kind == "cuda" and syncs and target_type(args, kwargs) == "cpu" \
                    and not _non_blocking_of_to(args, kwargs):
                label = sync_label("to_cpu")
                if label is not None:
                    return _ranged(label, original, self, *args, **kwargs)
            return original(self, *args, **kwargs)

        return to

    def make_cuda(original):
        def cuda(self, *args, **kwargs):
            if self.device.type == "cpu" and not compiling():
                nb = kwargs.get("non_blocking", args[1] if len(args) > 1 else False)
                return _ranged(_h2d(self, bool(nb)), original, self, *args, **kwargs)
            return original(self, *args, **kwargs)

        return cuda

    def make_copy(original):
        def copy_(self, src, *args, **kwargs):
            if isinstance(src, torch.Tensor) and self.is_cuda and src.device.type == "cpu" and not compiling():
                nb = kwargs.get("non_blocking", args[0] if args else False)
                return _ranged(_h2d(src, bool(nb)), original, self, src, *args, **kwargs)
            return original(self, src, *args, **kwargs)

        return copy_

    def make_pin(original):
        def pin_memory(self, *args, **kwargs):
            if compiling():
                return original(self, *args, **kwargs)
            return _ranged(names.pin_memory(self.nbytes), original, self, *args, **kwargs)

        return pin_memory

    if copies or syncs:
        _registry.patch(torch.Tensor, "to", make_to)
    if copies:
        _registry.patch(torch.Tensor, "cuda", make_cuda)
        _registry.patch(torch.Tensor, "copy_", make_copy)
        _registry.patch(torch.Tensor, "pin_memory", make_pin)
