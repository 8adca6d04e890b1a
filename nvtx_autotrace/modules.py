"""Module forward ranges named by their path from the root model: ``forward layer1.0.conv1 (Conv2d)``.

PyTorch's global forward (pre-)hooks see every module call without touching any
class. A *root* is a module called while no other module forward is open on
this thread; its ``named_modules()`` is read once into a table
``id(child) -> (names, depth)``, so a child's call costs one dict lookup. A
module shared between two places keeps its first path (named_modules order).
Wrappers (DDP, DataParallel, torch.compile's OptimizedModule) are seen through:
``module.layer1`` is named ``layer1``. A ranged module's first call notes the line that called it
(``sites.note_module``).
"""

from __future__ import annotations

import threading
import weakref

import torch

from nvtx_autotrace import _backend, _registry, autograd, sites, steps
from nvtx_autotrace._compile import compiling
from nvtx_trace import names

WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "FullyShardedDataParallel": "module",
    "OptimizedModule": "_orig_mod",
}

_tls = threading.local()
_tables: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


class _Entry:
    """What a module call needs, computed once per (root, module)."""

    __slots__ = ("module", "path", "depth", "forward", "backward", "sited")

    def __init__(self, module, path: str):
        self.module = module
        self.path = path
        self.depth = path.count(".") + 1 if path else 0
        cls = type(module).__name__
        self.forward = names.forward(path, cls)
        self.backward = names.module_backward(path, cls)
        self.sited = False  # its call's line noted (once: the first call)


def _wrapper_prefix(root) -> str:
    prefix, m = "", root
    while True:
        attr = WRAPPERS.get(type(m).__name__)
        inner = getattr(m, attr, None) if attr else None
        if not isinstance(inner, torch.nn.Module):
            return prefix
        prefix, m = prefix + attr + ".", inner


def _strip(path: str, prefix: str) -> str:
    """Path relative to the innermost wrapped model ("" for the wrappers themselves)."""
    if not prefix or not path:
        return path
    if path.startswith(prefix):
        return path[len(prefix):]
    return "" if prefix.startswith(path + ".") else path


def build_table(root) -> dict:
    """``id(module) -> _Entry`` for every module under ``root`` (first path wins)."""
    prefix = _wrapper_prefix(root)
    table = {}
    for path, m in root.named_modules():
        table.setdefault(id(m), _Entry(m, _strip(path, prefix)))
    return table


def _table_of(root) -> dict:
    table = _tables.get(root)
    if table is None:
        table = _tables[root] = build_table(root)
        if type(root).__name__ == "OptimizedModule":
            _registry.warn_once("compile", "modules inside torch.compile'd code get no forward ranges "
                                           "(only the compiled model as a whole)")
    return table


def _lookup(root, table: dict, module, parent: _Entry | None) -> _Entry:
    """Entry of a module missing from the table: rebuild once (the model changed), else ``<parent>.?``."""
    fresh = build_table(root)
    entry = fresh.get(id(module))
    if entry is not None and entry.module is module:
        table.clear()
        table.update(fresh)
        return entry
    path = f"{parent.path}.?" if parent is not None and parent.path else "?"
    entry = table[id(module)] = _Entry(module, path)
    return entry


class _Hooks:
    def __init__(self, max_depth: int, backward_modules: bool):
        self.max_depth = max_depth
        self.backward_modules = backward_modules

    def pre(self, module, args):
        if compiling():
            return None
        stack = _tls.__dict__.get("stack")
        if stack is None:
            stack = _tls.stack = []
        if stack:
            root, table, parent = stack[0][0], stack[-1][1], stack[-1][2]
        else:
            root, table, parent = module, _table_of(module), None
            steps.touch()
        entry = table.get(id(module))
        if entry is None or entry.module is not module:
            entry = _lookup(root, table, module, parent)
        emit = self.max_depth < 0 or entry.depth <= self.max_depth
        node = None
        if emit:
            if not entry.sited:
                entry.sited = sites.note_module(entry.forward, 2)  # 2: past the guard, to torch's call
            _backend.push(entry.forward)
            if self.backward_modules and torch.is_grad_enabled():
                node = autograd.input_node(args)
        stack.append((root, table, entry, emit, node))
        return None

    def post(self, module, args, output):
        if compiling():
            return None
        stack = _tls.__dict__.get("stack")
        if not stack or stack[-1][2].module is not module:
            return None  # the pre-hook did not run (installed mid-forward)
        _root, _table, entry, emit, node = stack.pop()
        if emit:
            _backend.pop()
            if self.backward_modules and output is not None and torch.is_grad_enabled():
                autograd.attach(entry.backward, node, output)
        return None


def install(max_depth: int, backward_modules: bool) -> None:
    from torch.nn.modules import module as module_mod

    hooks = _Hooks(max_depth, backward_modules)
    guard = _registry.Guard("module")
    h1 = module_mod.register_module_forward_pre_hook(guard.hook(hooks.pre))
    try:
        h2 = module_mod.register_module_forward_hook(guard.hook(hooks.post), always_call=True)
    except TypeError:  # torch < 2.1: no always_call; a raising forward leaves its range open
        h2 = module_mod.register_module_forward_hook(guard.hook(hooks.post))
    _registry.on_undo(h1.remove)
    _registry.on_undo(h2.remove)
    _registry.on_undo(_tables.clear)
    _registry.on_undo(lambda: _tls.__dict__.pop("stack", None))
