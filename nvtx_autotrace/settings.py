"""The program's performance settings, read once and written into the trace as one range.

The analyzer's busy-GPU findings (precision, fusion, optimizer, ...) can infer most
of a program's settings from kernel names, but not all, and not with certainty: a
kernel does not say whether TF32 was switched off or never asked for, whether the
optimizer was built with ``foreach=False``, or whether anomaly detection is on.
So, when step 1 begins (step 0 is warm-up: compilation, lazy initialisation), this
reads them once, in the training process, and writes ``nvtx_autotrace.settings
{json}``; when step 2 begins (``zero_grad`` and ``empty_cache`` usually come after
``optimizer.step()``, where steps end) and when a capture window opens, the record
is written again with what can change (counters, peak memory) brought up to date.

Per step it costs only three notes (``torch.autocast`` entries, ``zero_grad``'s
``set_to_none``, ``torch.cuda.empty_cache()`` calls): benchmarks/bench_settings.py.
"""

from __future__ import annotations

import gc
import os
import time

import torch

from nvtx_autotrace import _backend, _registry, sites, steps
from nvtx_trace import names

MAX_EXAMPLES = 3  # module paths named per pattern (conv bias before batch norm)

_seen: dict = {}  # what the counters saw: autocast (device, dtype), zero_grad set_to_none values, empty_cache calls
_record: dict | None = None  # the static part, read once
_guard = _registry.Guard("settings")


def install() -> None:
    _seen.clear()
    _seen.update(autocast=set(), set_to_none=set(), empty_cache=0)
    global _record
    _record = None

    autocast = _seen["autocast"]

    def make_enter(original):
        def __enter__(self):
            try:
                if self._enabled:
                    autocast.add((self.device, self.fast_dtype))
            except Exception:  # noqa: BLE001 - a note we can do without: never the program's problem
                pass
            return original(self)

        return __enter__

    def make_empty_cache(original):
        def empty_cache():
            _seen["empty_cache"] += 1
            return original()

        return empty_cache

    _registry.patch(torch.autocast, "__enter__", make_enter, contain=False)
    _registry.patch(torch.cuda, "empty_cache", make_empty_cache, contain=False)
    _registry.on_undo(steps.on_step_boundary_once(1, _guard.hook(emit)))
    _registry.on_undo(steps.on_step_boundary_once(2, emit_if_read))  # zero_grad, empty_cache: after step 1's step()


def note(key: str, value) -> None:
    """A figure measured elsewhere in the program (flops.py's count), written with the record from now on."""
    _seen.setdefault("notes", {})[key] = value
    emit_if_read()


def saw_zero_grad(args: tuple, kwargs: dict) -> None:
    """Called by optim.py's zero_grad wrapper (one wrapper per attribute: the registry never stacks them)."""
    if _seen:
        _seen["set_to_none"].add(bool(kwargs.get("set_to_none", args[0] if args else True)))


def emit() -> None:
    """Write the record (read now if not read yet) as one range on the calling thread."""
    global _record
    if _record is None:
        _seen["empty_cache_at_1"] = _seen["empty_cache"]
        t0 = time.perf_counter_ns()
        _record = read_static()
        _record["scan_ns"] = time.perf_counter_ns() - t0
    record = {**_record, **read_dynamic()}
    _backend.push(names.settings(record))
    _backend.pop()


def emit_if_read() -> None:
    """The record again (at a capture window's start), if it was read before."""
    if _record is not None and not _guard.off:
        _guard.hook(emit)()


def read_dynamic() -> dict:
    """What can change while the program runs: counters, memory peak, debugging switches."""
    step = max(steps.current_step(), 1)
    device = {}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated())}
    return {
        "steps_seen": step,
        "autocast": sorted(({"device": str(d), "dtype": str(t).replace("torch.", "")} for d, t in _seen["autocast"]),
                           key=lambda c: (c["device"], c["dtype"])),
        "zero_grad_set_to_none": (None if not _seen["set_to_none"] else
                                  next(iter(_seen["set_to_none"])) if len(_seen["set_to_none"]) == 1 else "mixed"),
        # counted from step 1 on: a call before the loop (or in warm-up) is not a call per step
        "empty_cache_per_step": (round((_seen["empty_cache"] - _seen["empty_cache_at_1"]) / (step - 1), 3)
                                 if step > 1 and "empty_cache_at_1" in _seen else None),
        "anomaly_detection": bool(torch.is_anomaly_enabled()),
        "autograd_profiler": _profiler_type(),
        **({"device_peak_allocated_bytes": device["peak_allocated_bytes"]} if device else {}),
        **({"module_sites": called} if (called := sites.module_sites()) else {}),
        **_seen.get("notes", {}),
    }


def read_static() -> dict:
    """One scan of the garbage collector's objects, and the backend flags."""
    found = _scan()
    roots = _roots(found["modules"], found["optimizers"])
    return {
        "torch": torch.__version__,
        "device": _device(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "grad_scaler": any(getattr(s, "_enabled", True) for s in found["scalers"]),
        "parameter_dtypes": _parameter_dtypes(roots),
        "compiled_modules": len(found["compiled"]),
        "cuda_graphs": len(found["graphs"]),
        "optimizers": [_optimizer(o) for o in found["optimizers"]],
        "dataloaders": [_loader(d) for d in found["loaders"]],
        "wrappers": sorted({type(m).__name__ for m in found["wrappers"]}),
        "framework": _framework(found),
        **_cpus(),
        "conv_bias_before_bn": _conv_bias_before_bn(roots),
        "odd_dimensions": _odd_dimensions(roots),
        "cwd": _cwd(),  # where the lines of syncs, copies and modules (sites.py) are named from
    }


def _cwd() -> str | None:
    import os

    try:
        return os.getcwd()
    except OSError:  # the folder was removed under the program
        return None


def _scan() -> dict:
    from torch.utils.data import DataLoader

    wrapper_types = tuple(t for t in (torch.nn.DataParallel, _ddp(), _fsdp()) if t is not None)
    compiled_type = getattr(getattr(torch, "_dynamo", None), "eval_frame", None)
    compiled_type = getattr(compiled_type, "OptimizedModule", None) if compiled_type else None
    scaler_types = tuple(t for t in (getattr(torch.amp, "GradScaler", None),
                                     getattr(getattr(torch.cuda, "amp", None), "GradScaler", None)) if t)
    graph_type = getattr(torch.cuda, "CUDAGraph", None)
    found = {k: [] for k in ("modules", "optimizers", "loaders", "wrappers", "compiled", "scalers", "graphs",
                             "drivers")}
    drivers = _driver_types()
    for o in gc.get_objects():
        t = type(o)
        if drivers and issubclass(t, drivers):
            found["drivers"].append(o)
            continue
        if issubclass(t, torch.nn.Module):
            if "_modules" not in vars(o):
                continue  # __init__ failed before Module.__init__
            found["modules"].append(o)
            if wrapper_types and isinstance(o, wrapper_types):
                found["wrappers"].append(o)
            if compiled_type is not None and isinstance(o, compiled_type):
                found["compiled"].append(o)
        elif issubclass(t, torch.optim.Optimizer):
            found["optimizers"].append(o)
        elif issubclass(t, DataLoader):
            found["loaders"].append(o)
        elif scaler_types and issubclass(t, scaler_types):
            found["scalers"].append(o)
        elif graph_type is not None and issubclass(t, graph_type):
            found["graphs"].append(o)
    return found


def _driver_types() -> tuple:
    """The frameworks' loop drivers, where the program imported them (never imported here)."""
    import sys

    out = []
    for module, name in (("transformers.trainer", "Trainer"), ("accelerate", "Accelerator"),
                         ("lightning.pytorch", "Trainer"), ("pytorch_lightning", "Trainer")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            out.append(cls)
    return tuple(out)


def _framework(found: dict) -> dict:
    """Which framework drives the loop, and its own precision and compile settings: fixes are phrased in its
    options (a Trainer's TrainingArguments, Lightning's Trainer(precision=...))."""
    for o in found["drivers"]:
        module = type(o).__module__
        try:
            if "lightning" in module:
                return {"name": "lightning", "precision": str(getattr(o, "precision", None))}
            if module.startswith("transformers"):
                args = getattr(o, "args", None)
                return {"name": "hf_trainer", **{k: getattr(args, k, None) for k in (
                    "bf16", "fp16", "tf32", "torch_compile", "dataloader_num_workers", "dataloader_pin_memory")}}
        except Exception:  # noqa: BLE001 - a name is all we need
            return {"name": "lightning" if "lightning" in module else "hf_trainer"}
    if found["drivers"]:
        return {"name": "accelerate"}
    return {"name": "pytorch"}


def _cpus() -> dict:
    """The CPUs this process may use (affinity, and a cgroup CPU quota where one is set) and the host's."""
    import os

    host = os.cpu_count()
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = host
    quota = _cgroup_quota()
    if quota is not None and allowed:
        allowed = max(1, min(allowed, int(quota)))
    return {"cpus_allowed": allowed, "cpus_host": host}


def _cgroup_quota() -> float | None:
    """cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``: CPUs' worth of time; None if unset."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as q, open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as p:
            quota, period = int(q.read()), int(p.read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def _ddp():
    try:
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel
    except ImportError:
        return None


def _fsdp():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        return FullyShardedDataParallel
    except ImportError:
        return None


def _roots(modules: list, optimizers: list) -> list:
    """Top-level modules holding parameters (those an optimizer trains, when there is one)."""
    from nvtx_autotrace.budget import roots_among

    wanted = {id(p) for o in optimizers for g in getattr(o, "param_groups", []) for p in g.get("params", [])}
    return roots_among(modules, wanted or None)


def _device() -> dict | None:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    try:
        free = int(torch.cuda.mem_get_info(i)[0])  # the driver's count: other processes' memory included
    except Exception:  # noqa: BLE001 - a note we can do without
        free = None
    return {"name": p.name, "capability": f"{p.major}.{p.minor}", "sm_count": int(p.multi_processor_count),
            "memory_total_bytes": int(p.total_memory), "memory_free_bytes": free,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")}


def _parameter_dtypes(roots: list) -> dict:
    counts: dict[str, int] = {}
    seen = set()
    for m in roots:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                key = str(p.dtype).replace("torch.", "")
                counts[key] = counts.get(key, 0) + p.numel()
    return counts


def _optimizer(o) -> dict:
    d = getattr(o, "defaults", {}) or {}
    groups = getattr(o, "param_groups", [])
    n = sum(len(g.get("params", [])) for g in groups)
    trained = sum(p.numel() for g in groups for p in g.get("params", []) if getattr(p, "requires_grad", False))
    return {"class": type(o).__name__, "module": type(o).__module__, "foreach": d.get("foreach"),
            "fused": d.get("fused"), "params": n, "trained_elements": int(trained)}


def _loader(d) -> dict:
    from nvtx_autotrace.dataloader import label_of

    workers = getattr(d, "num_workers", 0)
    return {"loader": label_of(d), "batch_size": getattr(d, "batch_size", None), "num_workers": workers,
            "pin_memory": bool(getattr(d, "pin_memory", False)),
            "persistent_workers": bool(getattr(d, "persistent_workers", False)),
            "prefetch_factor": getattr(d, "prefetch_factor", None) if workers else None}


def _each_module(roots: list):
    """(path, module) of every module under the roots, each once (a module shared by two roots, or twice in one)."""
    seen: set[int] = set()
    for root in roots:
        for path, m in root.named_modules():
            if id(m) not in seen:
                seen.add(id(m))
                yield path, m


def _conv_bias_before_bn(roots: list) -> dict:
    """Convolutions with a bias whose next sibling (in registration order) is a batch norm: the norm
    subtracts the mean, so the bias is computed, stored and differentiated for nothing."""
    convs = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm)
    count, examples = 0, []
    for path, m in _each_module(roots):
        kids = [(k, c) for k, c in vars(m)["_modules"].items() if c is not None]
        for (name, a), (_, b) in zip(kids, kids[1:]):
            if isinstance(a, convs) and a.bias is not None and isinstance(b, norms):
                count += 1
                if len(examples) < MAX_EXAMPLES:
                    examples.append(f"{path}.{name}" if path else name)
    return {"count": count, "examples": examples}


def _odd_dimensions(roots: list) -> list[dict]:
    """The matrix layers (Linear, Embedding) with a dimension that is not a multiple of 8, largest first (at most
    MAX_EXAMPLES): tensor-core GEMMs over them read one element at a time (the alignment finding names them)."""
    found = []
    for path, m in _each_module(roots):
        if isinstance(m, torch.nn.Linear):
            dims = (m.in_features, m.out_features)
        elif isinstance(m, torch.nn.Embedding):
            dims = (m.num_embeddings, m.embedding_dim)
        else:
            continue
        odd = [d for d in dims if d % 8]
        if odd:
            found.append({"module": path or type(m).__name__, "class": type(m).__name__, "dims": list(dims),
                          "odd": max(odd), "elements": dims[0] * dims[1]})
    found.sort(key=lambda d: -d["elements"])
    return [{k: v for k, v in d.items() if k != "elements"} for d in found[:MAX_EXAMPLES]]


def _profiler_type() -> str | None:
    """The autograd profiler running now: 'nvtx' for emit_nvtx, 'kineto' for torch.profiler, None when off."""
    try:
        kind = torch._C._autograd._profiler_type()
    except Exception:  # noqa: BLE001 - private API: absent in some versions
        return "on" if torch.autograd.profiler._is_profiler_enabled else None
    text = str(kind).rsplit(".", 1)[-1].lower()
    return None if text == "none" else text
