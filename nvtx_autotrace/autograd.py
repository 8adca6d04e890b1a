"""``backward`` ranges, and per-module backward ranges on the thread that runs them.

On CUDA the autograd engine runs backward nodes on its own thread
(``pt_autograd_0``), so a ``backward`` range pushed by the training thread
contains none of the backward kernel launches. To attribute them, each module
forward (within the depth limit) leaves two hooks on the autograd graph:

* a pre-hook on the ``grad_fn`` of the module's output: the module's backward
  starts when that node is about to run;
* a pre-hook on the ``grad_fn`` that produced the module's input (captured before
  the forward, so in-place modules are handled): when it is about to run, the
  gradient of the input is complete, so the module's backward is over.

Both fire on the thread that executes the graph, so the range
``backward <path> (<cls>)`` lands on ``pt_autograd_0`` next to the kernels. They
are start/end ranges (nesting on that thread is not guaranteed). Ranges whose end
never fires (the input needs no gradient: the root module, the first layer) are
closed by a callback queued on the graph task, which runs when its backward ends.
Full module backward hooks were rejected: they wrap inputs and outputs in extra
autograd nodes and raise on in-place ops such as ``ReLU(inplace=True)``.
"""

from __future__ import annotations

import threading

import torch

from nvtx_autotrace import _backend, _registry, memory, steps
from nvtx_autotrace._compile import compiling
from nvtx_trace import names

_open: dict[int, dict] = {}  # graph task id -> {_ModuleBackward: None} still open
_queued: set[int] = set()
_lock = threading.Lock()
_current_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
GUARD = _registry.Guard("module backward")  # autograd runs these hooks: an error must not stop backward


class _ModuleBackward:
    """One module call's backward range, opened and closed from autograd node pre-hooks."""

    __slots__ = ("name", "handle", "task", "__weakref__")

    def __init__(self, name: str):
        self.name = name
        self.handle = None
        self.task = -1

    def start(self, _grad_outputs):
        if self.handle is None:
            task = _current_task()
            self.handle = _backend.start(self.name)
            self.task = task
            with _lock:
                _open.setdefault(task, {})[self] = None
                if task not in _queued:
                    _queued.add(task)
                    torch.autograd.Variable._execution_engine.queue_callback(GUARD.hook(lambda: close_task(task)))
        return None

    def end(self, _grad_outputs):
        handle = self.handle
        if handle is not None:
            self.handle = None
            with _lock:
                _open.get(self.task, {}).pop(self, None)
            _backend.end(handle)
        return None


def close_task(task: int) -> None:
    """End every module-backward range of one finished backward pass."""
    with _lock:
        left = _open.pop(task, {})
        _queued.discard(task)
    for rec in reversed(list(left)):
        rec.end(None)


def close_all() -> None:
    with _lock:
        tasks = list(_open)
    for task in tasks:
        close_task(task)


def input_node(args):
    """The grad_fn that produced the first tensor argument needing a gradient (or None)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            fn = a.grad_fn
            if fn is not None:
                return fn
    return None


def output_node(out):
    if isinstance(out, torch.Tensor):
        return out.grad_fn
    if isinstance(out, (tuple, list)):
        items = out
    elif isinstance(out, dict):
        items = out.values()
    else:
        return None
    for o in items:
        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
            return o.grad_fn
    return None


def attach(name: str, in_node, out) -> None:
    """Leave the two hooks for one module call (called from the module forward hook)."""
    if GUARD.off:
        return
    out_node = output_node(out)
    if out_node is None or out_node is in_node:
        return  # no graph, or the module passed its input through
    rec = _ModuleBackward(name)
    out_node.register_prehook(GUARD.hook(rec.start))
    if in_node is not None:
        in_node.register_prehook(GUARD.hook(rec.end))


def install(emit_backward: bool) -> None:
    """Wrap ``torch.autograd.backward`` and ``Tensor.backward`` in one ``backward`` range."""
    depth = threading.local()

    def make(original):
        def backward(*args, **kwargs):
            if compiling():
                return original(*args, **kwargs)
            steps.touch()
            if getattr(depth, "n", 0) or not emit_backward:
                return original(*args, **kwargs)
            memory.at_phase("backward")
            depth.n = 1
            _backend.push(names.BACKWARD)
            try:
                return original(*args, **kwargs)
            finally:
                _backend.pop()
                depth.n = 0

        return backward

    _registry.patch(torch.autograd, "backward", make)
    _registry.patch(torch.Tensor, "backward", make)
    _registry.on_undo(close_all)
