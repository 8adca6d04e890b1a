"""Module ranges for chosen module instances, through ``forward`` wrapped on their class.

Global module hooks put *every* module call of the program on PyTorch's slow
path (+4-6 µs a call on a 2-core CPU, ranged or not; benchmarks/range_costs.py)
and make ``torch.compile(module)`` warn on every call. Instead, the ``forward``
of each class that has a chosen instance is wrapped once, on the class: a call
of any other instance costs a dict lookup, a chosen one pushes its range (and,
with grad, leaves the two backward pre-hooks of ``autograd.attach``). Class
attributes are neither pickled nor deep-copied with instances, so
``torch.save(model)`` and ``copy.deepcopy(model)`` (EMA) see the model as it was.

A slot can also just count calls (``counting``): the budget (budget.py) counts
one or two steps' module calls before it chooses which modules get ranges.
"""

from __future__ import annotations

import types
import weakref

import torch

from nvtx_autotrace import _backend, _registry, autograd, sites
from nvtx_autotrace._compile import compiling

_slots: dict[int, "Slot"] = {}  # id(module) -> slot
_patched: dict[tuple[type, str], object] = {}  # (class, attribute) -> what the class itself held before


class Slot:
    """What one module instance's calls do: count, range its forward, and maybe its backward."""

    __slots__ = ("ref", "owner", "forward", "backward", "ranged", "with_backward", "counting", "calls",
                 "grad_calls", "depth", "sited")

    def __init__(self, module, owner: type, forward: str, backward: str, depth: int):
        self.ref = weakref.ref(module)
        self.owner = owner  # the class whose wrapper acts (a super().forward() chain must not range twice)
        self.forward, self.backward, self.depth = forward, backward, depth
        self.ranged = self.with_backward = self.counting = False
        self.calls = self.grad_calls = 0
        self.sited = False  # the line of its first ranged call noted (sites.note_module)


def wrapped_attribute(module) -> tuple[type, str] | None:
    """(class, attribute) to wrap so that calls of ``module`` pass through us, or None."""
    if type(module).__name__ == "OptimizedModule":  # torch.compile sets forward on the instance
        cls = next((k for k in type(module).__mro__ if "__call__" in vars(k)), None)
        return (cls, "__call__") if cls is not None and cls is not torch.nn.Module else None
    if "forward" in vars(module):
        return None  # an instance-level forward: wrapping the class would not see it
    cls = next((k for k in type(module).__mro__ if "forward" in vars(k)), None)
    if cls is None or cls is torch.nn.Module:
        return None  # containers (ModuleList, ModuleDict) are never called
    if not isinstance(vars(cls)["forward"], types.FunctionType):
        return None  # staticmethod, builtin, partial, property...: wrapping would change how it binds
    return cls, "forward"


def _enter(slot: Slot, args):
    """Our part before the original forward: count, or push the range (and note the input's grad_fn)."""
    if slot.counting:
        slot.calls += 1
        if torch.is_grad_enabled():
            slot.grad_calls += 1
    if not slot.ranged:
        return False, None
    if not slot.sited:  # 2: past the forward wrapper, to the torch frame that called it
        slot.sited = sites.note_module(slot.forward, 2)
    node = autograd.input_node(args) if slot.with_backward and torch.is_grad_enabled() else None
    _backend.push(slot.forward)
    return True, node


def _leave(slot: Slot, node, out) -> None:
    if slot.with_backward and out is not None and torch.is_grad_enabled():
        autograd.attach(slot.backward, node, out)


def _failed(exc: BaseException) -> None:
    """Our part raised: every module range goes, the program runs on."""
    clear()
    _registry.warn_once("patch-module", f"module ranges switched off after an internal error "
                                        f"({type(exc).__name__}: {exc}); the program runs on")


def _make(original, owner: type):
    """The wrapper, built to read only its closure, then given the original's globals: TorchScript
    (``torch.jit.script``) reads the original's source through ``__wrapped__`` and resolves its names
    (``F``, ``Tensor``...) in the wrapper's globals, which therefore must be the original's.
    Only ``original`` can raise into the program: errors of our part switch module ranges off."""
    slots, is_compiling, enter, leave, failed, backend = _slots, compiling, _enter, _leave, _failed, _backend

    def forward(self, *args, **kwargs):
        slot = slots.get(id(self))
        if slot is None or slot.owner is not owner or is_compiling() or slot.ref() is not self:
            return original(self, *args, **kwargs)
        try:
            pushed, node = enter(slot, args)
        except Exception as exc:  # noqa: BLE001
            failed(exc)
            return original(self, *args, **kwargs)
        if not pushed:
            return original(self, *args, **kwargs)
        try:
            out = original(self, *args, **kwargs)
        finally:
            try:
                backend.pop()
            except Exception as exc:  # noqa: BLE001
                failed(exc)
        try:
            leave(slot, node, out)
        except Exception as exc:  # noqa: BLE001
            failed(exc)
        return out

    return types.FunctionType(forward.__code__, original.__globals__, original.__name__, None, forward.__closure__)


def add(module, forward: str, backward: str, depth: int) -> Slot | None:
    """The slot of ``module`` (created, and its class wrapped, on first use); None if it cannot be wrapped."""
    slot = _slots.get(id(module))
    if slot is not None and slot.ref() is module:
        return slot
    where = wrapped_attribute(module)
    if where is None:
        return None
    cls, attr = where
    if where not in _patched:
        original = getattr(cls, attr)
        _patched[where] = vars(cls)[attr]
        wrapper = _make(original, cls)
        for name in ("__qualname__", "__doc__", "__module__"):
            setattr(wrapper, name, getattr(original, name))
        wrapper.__wrapped__ = original  # inspect.signature(model.forward) stays the user's (HF Trainer reads it)
        setattr(wrapper, _registry.PATCHED_MARK, original)
        setattr(cls, attr, wrapper)
    slot = _slots[id(module)] = Slot(module, cls, forward, backward, depth)
    return slot


def slots() -> list[Slot]:
    return [s for s in _slots.values() if s.ref() is not None]


def keep_only(keep) -> None:
    """Drop every slot for which ``keep(slot)`` is false; unwrap classes left with no slot."""
    for key, slot in list(_slots.items()):
        if slot.ref() is None or not keep(slot):
            del _slots[key]
    used = {(s.owner, "__call__" if type(s.ref()).__name__ == "OptimizedModule" else "forward") for s in _slots.values()}
    for where in [w for w in _patched if w not in used]:
        setattr(where[0], where[1], _patched.pop(where))


def clear() -> None:
    """Forget every slot and restore every wrapped class attribute."""
    _slots.clear()
    for (cls, attr), own in list(_patched.items()):
        setattr(cls, attr, own)
    _patched.clear()
