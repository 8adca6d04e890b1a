"""What-if knobs: apply a finding's fix at import time, without editing the script (``nvtx-trace try``).

``NVTX_AUTOTRACE_TRY`` arms them (a JSON object from the runner, or ``amp=bf16,num_workers=8`` typed by hand); each
knob's declaration (nvtx_trace/knobs/) says where it is applied. Settings the script makes before it builds anything
(DataLoader and optimizer arguments, backend flags) are overridden where they are made; what needs the model
(autocast, compile, channels_last) is applied when step 1 begins, to the top-level modules the optimizer trains
(one scan of the garbage collector's objects, as the module-range budget does). Each knob reports what it changed
and where, or why it could not apply: one record in the window file for the runner (``{"event": "knob", "knobs":
{...}, "applied": ..., "line": ...}``) and the same line on stderr, prefixed ``nvtx-trace try:``, for the user.
"""

from __future__ import annotations

import functools
import sys

from nvtx_autotrace import _registry, steps, window_file
from nvtx_trace import knobs as declared


def report(knobs: dict, said: str, applied: bool = True) -> None:
    """What ``knobs`` changed (or, ``applied=False``, why they could not): the runner's record and the user's line."""
    line = f"{declared.text(knobs)}: {said}"
    print(f"nvtx-trace try: {line}", file=sys.stderr, flush=True)
    window_file.note("knob", knobs=knobs, applied=applied, line=line)


def _wrap(owner, attr: str, make) -> None:
    """Replace ``owner.attr`` by ``make(original)``, undone with the rest; unmarked, so the range wrappers
    installed after it wrap it in turn (the registry never stacks its own)."""
    _registry.patch(owner, attr, make, contain=False, mark=False)


def install(knobs: dict) -> None:
    """Each knob where its declaration says it applies (``Knob.applied``)."""
    by: dict[str, dict] = {}
    for name, value in knobs.items():
        by.setdefault(declared.get(name).applied, {})[name] = value
    if by.get("dataloader"):
        _loaders(by["dataloader"])
    if by.get("backend"):
        flags = by["backend"]
        _flags(flags, "at start-up")
        _registry.on_undo(steps.on_step_boundary_once(1, lambda: _flags(flags, "again when step 1 began", quiet=True)))
    if by.get("optimizer"):
        _optimizers(by["optimizer"])
    for name, value in (by.get("call") or {}).items():
        knob = declared.get(name)
        apply = knob.install or CALLS[name]
        apply(value, functools.partial(_report_one, name, value))
    for name, value in (by.get("option") or {}).items():
        report({name: value}, "not applied: only the program's own option does this (nvtx-trace tune tries it "
               "there; nvtx_autotrace cannot rewrite the code)", applied=False)
    if by.get("model"):
        model = by["model"]
        _registry.on_undo(steps.on_step_boundary_once(1, lambda: _models(model)))


def _report_one(name: str, value, said: str, applied: bool = True) -> None:
    report({name: value}, said, applied)


def _set_to_none(value, say) -> None:
    import torch

    if not value:
        return

    def make_zero_grad(original):
        def zero_grad(self, *args, **kwargs):
            kwargs.pop("set_to_none", None)
            return original(self, *args[1:], set_to_none=True, **kwargs)

        return zero_grad

    _wrap(torch.optim.Optimizer, "zero_grad", make_zero_grad)
    say("every optimizer.zero_grad() frees the gradients (set_to_none=True)")


def _no_empty_cache(value, say) -> None:
    import torch

    if not value:
        return
    calls = [0]

    def make_empty_cache(original):
        def empty_cache():
            calls[0] += 1
            if calls[0] == 1:
                say("torch.cuda.empty_cache() called; skipped (and every later call)")

        return empty_cache

    _wrap(torch.cuda, "empty_cache", make_empty_cache)


def _loaders(loader: dict) -> None:
    import inspect

    from torch.utils.data import dataloader as dl

    seen: set[str] = set()

    def make_init(original):
        signature = inspect.signature(original)

        def __init__(self, *args, **kwargs):
            try:  # by name, whatever the script passed by position
                call = signature.bind(self, *args, **kwargs).arguments
                call.pop("self", None)
                call.update(call.pop("kwargs", {}))
            except TypeError:  # DataLoader will say what is wrong
                return original(self, *args, **kwargs)
            applied = dict(loader)
            refused = _workers_refused(call.get("dataset"), call.get("num_workers", 0), applied.get("num_workers"))
            if refused:
                applied.pop("num_workers")
            if applied.get("num_workers", call.get("num_workers", 0)) == 0:
                for k in workers_only():  # DataLoader refuses them without workers: ours, and the script's own
                    applied.pop(k, None)
                    call.pop(k, None)
            call.update(applied)
            original(self, **call)
            try:
                from nvtx_autotrace.dataloader import creation_site

                site = creation_site(self)
            except Exception:  # noqa: BLE001 - only the message needs it
                site = "?"
            if site not in seen:
                seen.add(site)
                if applied:
                    report(applied, f"DataLoader created at {site}")
                if refused:
                    report({"num_workers": loader["num_workers"]}, f"not applied to the DataLoader created at {site}: "
                           f"{refused}", applied=False)

        return __init__

    _wrap(dl.DataLoader, "__init__", make_init)


def workers_only() -> tuple:
    """DataLoader arguments that need worker processes (persistent_workers, prefetch_factor): DataLoader refuses
    them without workers."""
    return tuple(k.name for k in declared.registry().values() if k.needs_workers)


def _single_device_data_parallel(value, say) -> None:
    """DataParallel over one GPU scatters each batch, gathers each output and runs its module in a thread; with
    the inputs already on that GPU, calling the module is the same computation without that host work."""
    import torch

    if not value:
        return
    seen: set[int] = set()

    def make_forward(original):
        def forward(self, *args, **kwargs):
            ids = getattr(self, "device_ids", None) or []
            if len(ids) == 1 and _all_on(args, kwargs, ids[0]):
                if id(self) not in seen:
                    seen.add(id(self))
                    say(f"DataParallel over one GPU ({type(self.module).__name__}) calls its module directly (no "
                        "scatter, gather or thread)")
                return self.module(*args, **kwargs)
            if id(self) not in seen:
                seen.add(id(self))
                why = ("it spans several GPUs" if len(ids) > 1 else "it drives no GPU" if not ids else
                       "its inputs are not on its GPU yet (it moves them)")
                say(f"not applied to DataParallel ({type(self.module).__name__}): {why}", applied=False)
            return original(self, *args, **kwargs)

        return forward

    _wrap(torch.nn.DataParallel, "forward", make_forward)


def _all_on(args, kwargs, device_id) -> bool:
    import torch

    tensors = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a)]
    return bool(tensors) and all(t.is_cuda and t.device.index == device_id for t in tensors) and not any(
        isinstance(a, (list, tuple, dict)) for a in (*args, *kwargs.values()))


def _workers_refused(dataset, have: int, want) -> str:
    """Why workers would change what the loop sees (not only how fast), or ''."""
    import torch

    if not want or have:
        return ""  # no workers asked for, or the script runs workers already (and so is ready for them)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return ("its dataset is an IterableDataset: each worker would yield all of it unless the dataset splits "
                "itself by torch.utils.data.get_worker_info()")
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and any(torch.is_tensor(t) and t.is_cuda for t in tensors):
        return "its tensors are on the GPU: worker processes cannot use CUDA (and the data needs no loading)"
    return ""


def _flags(flags: dict, when: str, quiet: bool = False) -> None:
    """Each knob's ``torch.backends`` attributes (its declaration's ``backend``) set to its value."""
    import torch

    attributes = []
    for name, value in flags.items():
        for dotted in declared.get(name).backend:
            owner_path, attr = dotted.rsplit(".", 1)
            setattr(functools.reduce(getattr, owner_path.split("."), torch), attr, bool(value))
            attributes.append(f"torch.{dotted}")
    if not quiet:
        report(flags, f"set {when} ({', '.join(attributes)}), and again when step 1 begins")


def _optimizers(knobs: dict) -> None:
    """``fused=True`` (or ``foreach=True``: the knob's ``optimizer_arg``) for every optimizer class that takes it, as
    it is built; the other such arguments set to None (PyTorch refuses fused and foreach together)."""
    import inspect

    import torch

    asked = {declared.get(k).optimizer_arg: k for k, v in knobs.items() if v}
    if not asked:
        return
    mode, name = next(iter(asked.items()))
    others = [k.optimizer_arg for k in declared.registry().values() if k.optimizer_arg and k.optimizer_arg != mode]
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad, torch.optim.RMSprop):
        if mode not in inspect.signature(cls.__init__).parameters:
            continue

        def make_init(original, cls=cls):
            def __init__(self, *args, **kwargs):
                kwargs[mode] = True
                kwargs.update({other: None for other in others})
                if type(self) is cls:
                    report({name: knobs[name]}, f"{cls.__name__} built with {mode}=True")
                return original(self, *args, **kwargs)

            return __init__

        _wrap(cls, "__init__", make_init)


def _models(model: dict) -> None:
    """At step 1: autocast, compile, channels_last on the models the optimizer trains."""
    from nvtx_autotrace import budget

    lead = steps._lead() if steps._lead is not None else None  # the optimizer whose steps are the steps
    found = budget.find_roots(lead)
    compiled = [r for r in found if budget.compiled(r) and model.get("compile")]
    for r in compiled:
        report({"compile": model["compile"]}, f"not applied to {type(r).__name__}: it is compiled already",
               applied=False)
    roots = [r for r in found if r not in compiled]
    if not roots:
        if not compiled:
            report(model, "not applied: no model found (no module holds parameters that require grad)", applied=False)
        return
    for root in roots:
        where = type(root).__name__
        if "channels_last" in model and model["channels_last"]:
            _channels_last(root, where, lead)
        if "amp" in model:
            _autocast(root, where, model["amp"])
        if model.get("compile"):
            inner = _inside_wrapper(root)
            mode = model["compile"] if isinstance(model["compile"], str) else None
            inner.compile(**({"mode": mode} if mode else {}))
            held = f"{where}.module ({type(inner).__name__}, inside the wrapper)" if inner is not root else where
            said = f'compile(mode="{mode}")' if mode else "compile()"
            report({"compile": model["compile"]}, f"{held}.{said} (in place): its forward is compiled at its next "
                   "call; the first steps after are slow while it compiles")


def _inside_wrapper(root):
    """The module a DataParallel or DistributedDataParallel wraps: compiling the wrapper compiles its scatter and
    gather, not the model (measured: 1.01x on a one-GPU DataParallel), so the model inside is compiled."""
    import torch

    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
    while isinstance(root, wrappers) and isinstance(getattr(root, "module", None), torch.nn.Module):
        root = root.module
    return root


def _autocast(root, where: str, dtype: str) -> None:
    import torch

    if dtype == "fp16":
        report({"amp": dtype}, "not applied: fp16 needs a GradScaler around backward and the optimizer step; use "
               "amp=bf16", applied=False)
        return
    # Lightning's training_step computes the loss, often calling a submodule rather than self.forward: autocast
    # goes around it too, as Lightning's own precision plugin does
    methods = ["forward"] + (["training_step"] if callable(getattr(root, "training_step", None)) else [])
    for name in methods:
        original = getattr(root, name)

        def autocast_call(*args, _original=original, **kwargs):
            with torch.autocast(device_type=_device_type(root), dtype=torch.bfloat16):
                return _original(*args, **kwargs)

        setattr(root, name, functools.wraps(original)(autocast_call))
    runs = "runs" if len(methods) == 1 else "run"
    report({"amp": dtype}, f"{where}.{' and .'.join(methods)} {runs} under torch.autocast(dtype=torch.bfloat16) "
           "from step 1 on (a loss computed outside it gets bf16 outputs)")


def _channels_last(root, where: str, optimizer=None) -> None:
    import torch

    if not any(p.dim() == 4 for p in root.parameters()):  # a layout of 4-D tensors: nothing here to change
        report({"channels_last": True}, f"not applied: {where} has no 4-D weights (convolutions); the layout changes "
               "only 4-D tensors", applied=False)
        return
    root.to(memory_format=torch.channels_last)
    moved = 0
    if optimizer is not None:  # its state (momentum, Adam's moments) was made at step 0, in the old layout
        for state in getattr(optimizer, "state", {}).values():
            for key, value in list(state.items()):
                if torch.is_tensor(value) and value.dim() == 4:
                    state[key] = value.contiguous(memory_format=torch.channels_last)
                    moved += 1
    forward = root.forward

    @functools.wraps(forward)
    def channels_last_forward(*args, **kwargs):
        args = tuple(a.contiguous(memory_format=torch.channels_last) if torch.is_tensor(a) and a.dim() == 4 else a
                     for a in args)
        return forward(*args, **kwargs)

    root.forward = channels_last_forward
    report({"channels_last": True}, f"{where} and its 4-D inputs in channels_last from step 1 on"
           + (f", and {moved} optimizer state tensors with them" if moved else ""))


def _device_type(root) -> str:
    for p in root.parameters():
        return p.device.type
    return "cuda"



# the knobs applied by a call at start-up whose code lives here (a declaration of yours brings its own install)
CALLS = {"set_to_none": _set_to_none, "no_empty_cache": _no_empty_cache, "no_data_parallel": _single_device_data_parallel}
