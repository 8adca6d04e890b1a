"""GPU memory per step, what keeps growing and where, and why a run died of out-of-memory.

Per step, from the caching allocator's own counters (host-side: no sync): allocated and reserved bytes at the
step's start, the step's peaks, its backward passes (micro-batches) and, every 4th step, the peak allocated by the
time backward began and by the time the optimizer step began (which part of the step set the peak). One range per
step, ``nvtx_autotrace.memory {json}``, written when the next step begins.

A per-step peak needs the allocator's peak counters reset each step, which a program reading
``torch.cuda.max_memory_allocated()`` would see; so every peak reset here is carried and folded back into what
``torch.cuda.memory_stats()`` (and everything built on it) returns: the program sees its peaks since its start,
as without us, and its own ``reset_peak_memory_stats()`` still resets them.

In warm-up only (from the first sign of training until the capture window opens or step ``HISTORY_UNTIL``, whichever
comes first; never where the program records history itself), the allocator records the Python stack of each live
block (``_record_memory_history``, live blocks only): the bytes still alive per line of the training loop at step 2
and where it stops say which lines leak (``nvtx_autotrace.memory_lines``), and an out-of-memory error names its
largest live allocations by line. The window itself runs without it, unless ``NVTX_AUTOTRACE_MEMORY_HISTORY=all``
(``0``: never).
An out-of-memory error is written (window file and range ``nvtx_autotrace.oom {json}``) from the allocator's
out-of-memory observer, before the program sees the exception.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading

from nvtx_autotrace import _backend, _registry, steps, window_file
from nvtx_trace import names

LEAK_FROM_STEP = 2  # steps 0 and 1 create what lasts (optimizer state, cuDNN workspaces): growth is counted after
PHASES_EVERY = 4  # the peaks by backward and by the optimizer step are read every 4th step (alike in a steady loop)
HISTORY_UNTIL = 12  # without a capture window, the stacks are recorded until this step
HISTORY_ENV = "NVTX_AUTOTRACE_MEMORY_HISTORY"  # warmup (default) | all | 0
TOP_LINES = 5
_state: dict = {}
_carried: dict = {}  # device -> {peak path: the highest peak the resets dropped}: kept across a reinstall
_pending: dict = {}  # device -> the stats read just before each reset, not yet folded into _carried
CARRY_EVERY = 32  # stats held before they are folded: one warm loop every 32 steps costs less than 32 cold ones
_carry_lock = threading.Lock()  # the program may read or reset its peaks on another thread than the training one
_observer = {"attached": False}  # the allocator cannot detach it: attached once per process
_guard = _registry.Guard("memory")


def install() -> None:
    import torch

    # a CUDA build only, and no CUDA call: torch.cuda.is_available() here would initialise the driver at import
    # (and make fork unsafe for a program that forks CUDA workers); everything waits for the first sign of training
    if not getattr(torch.cuda, "_is_compiled", lambda: False)():
        return
    _state.clear()
    mode = os.environ.get(HISTORY_ENV, "warmup").strip().lower() or "warmup"
    _state.update(device=None, start=None, forward_peak=None, backward_peak=None, phase="forward",
                  history=False, history_mode=mode, loop=None, lines_at=None, lines=None, oom_step=None,
                  window_coming=bool(os.environ.get(names.CAPTURE_ENV) or os.environ.get(names.AUTO_WINDOW_ENV)))
    _fold_peaks_back(torch)
    _registry.on_undo(steps.on_training_start(_guard.hook(_started)))
    _registry.on_undo(steps.on_step_boundary(_guard.hook(_boundary)))
    _registry.on_undo(_uninstall)


def _uninstall() -> None:
    stop_history()
    _state.clear()  # the observer cannot be detached: it does nothing without state; the carried peaks stay


def _stats(torch, device: int) -> dict:
    return torch._C._cuda_memoryStats(device)


def _read(torch, device: int, stats: dict | None = None) -> tuple[int, int, int, int]:
    s = stats if stats is not None else _stats(torch, device)
    a, r = s["allocated_bytes"]["all"], s["reserved_bytes"]["all"]
    return a["current"], a["peak"], r["current"], r["peak"]


def _started() -> None:
    """The first sign of training: the device is the training thread's, and warm-up's history begins."""
    import torch

    if not torch.cuda.is_initialized():
        return
    device = _training_device(torch)
    _state["device"] = device
    stats = _reset_peaks(torch, device)
    a, _ap, r, _rp = _read(torch, device, stats)
    _state["start"] = (a, r)
    _attach_observer(torch)
    if _state["history_mode"] in ("0", "off", "false", "no"):
        return
    enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if enabled is None or enabled():  # the program records its own history: never narrowed nor stopped by us
        return
    try:
        torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python", device=device)
        _state["history"] = True
    except Exception:  # noqa: BLE001 - an older torch, or a build without it: no lines, nothing else lost
        _state["history"] = False


def _training_device(torch) -> int:
    """The device holding most of the process's memory: the one it trains on, also where a DDP rank moved its
    model to cuda:N without set_device (its current device is then 0, and empty)."""
    def held(i: int) -> int:
        try:
            return _stats(torch, i)["allocated_bytes"]["all"]["current"]
        except Exception:  # noqa: BLE001 - a device the allocator does not know
            return -1

    best = torch.cuda.current_device()
    most = held(best)
    for i in range(torch.cuda.device_count()):
        if (now := held(i)) > most:  # another device only where it holds more: the current one wins a tie
            best, most = i, now
    return best


def at_phase(phase: str) -> None:
    """backward began, or the optimizer step began: the step's peak so far belongs to what came before."""
    if not _state or _state.get("start") is None or _guard.off:
        return
    first = phase != "backward" or _state["phase"] == "forward"  # a later micro-batch's backward: not the first
    if phase == "backward":
        _state["backwards"] = _state.get("backwards", 0) + 1  # backward passes: gradient accumulation
    _state["phase"] = phase  # every step: an out-of-memory error says where it came
    if not first or not _state.get("phases_now"):
        return
    try:
        import torch

        peak = _stats(torch, _state["device"])["allocated_bytes"]["all"]["peak"]  # host counters: no sync
        _state["forward_peak" if phase == "backward" else "backward_peak"] = peak
    except Exception:  # noqa: BLE001 - a note we can do without
        pass


def _boundary(n: int) -> None:
    import torch

    if _state.get("start") is None:
        if n == 1:  # no sign of training came first (a loop that only steps): start now
            _started()
        return
    device = _state["device"]
    stats = _reset_peaks(torch, device)  # one read a step (13 µs alone, 43-65 µs in the loop on an H200 host)
    a, ap, r, rp = _read(torch, device, stats)
    (a0, r0), fwd, bwd = _state["start"], _state["forward_peak"], _state["backward_peak"]
    record = {"step": n - 1, "allocated": a0, "reserved": r0, "peak_allocated": ap, "peak_reserved": rp,
              "end_allocated": a}
    if fwd is not None:
        record["forward_peak"] = fwd
    if bwd is not None:
        record["backward_peak"] = bwd
    if _state.get("backwards"):
        record["backwards"] = _state["backwards"]
    _backend.push(names.memory(record))
    _backend.pop()
    _state.update(start=(a, r), forward_peak=None, backward_peak=None, phase="forward", backwards=0,
                  phases_now=n % PHASES_EVERY == 0)
    if n == LEAK_FROM_STEP and _state["history"]:
        _state["loop"] = _loop_function()
        _state["lines_at"] = (n, _live_by_line(torch))
    elif n == HISTORY_UNTIL and _state["history"] and _state["history_mode"] != "all":
        _lines_at_window(n)
        stop_history()
        if not _state["window_coming"]:
            emit_lines()


def window_opening(step: int) -> None:
    """Just before a capture window starts: the lines whose live bytes grew in warm-up, and history off."""
    if not _state or _guard.off or not _state.get("history"):
        return
    _guard.hook(_lines_at_window)(step)
    if _state["history_mode"] != "all":
        stop_history()


def _lines_at_window(step: int) -> None:
    import torch

    before = _state.get("lines_at")
    if not before or step - before[0] < 2:
        return
    first, then = before
    now = _live_by_line(torch)
    grew = sorted(((now[k] - then.get(k, 0)) / (step - first), k) for k in now if now[k] > then.get(k, 0))
    _state["lines"] = {"from_step": first, "to_step": step,
                       "lines": [{"where": where, "code": code, "bytes_per_step": round(per)}
                                 for per, (where, code) in sorted(grew, reverse=True)[:TOP_LINES]]}


def emit_lines() -> None:
    """Inside the window: the growing lines found just before it."""
    if _state.get("lines") and not _guard.off:
        _backend.push(names.memory_lines(_state["lines"]))
        _backend.pop()


def stop_history() -> None:
    """Only the history we started (a program's own recording is never touched)."""
    if _state.get("history"):
        _state["history"] = False
        try:
            import torch

            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:  # noqa: BLE001
            pass


def peak_allocated() -> int | None:
    """The program's peak since its start (as it would read it): for a timed run's window note."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001
        return None


# ---- the peaks the program reads --------------------------------------------------------------------------

def _reset_peaks(torch, device: int, stats: dict | None = None) -> dict:
    """Read the stats (unless given), keep them (the peaks the reset drops: folded into the carried peaks in
    batches), then reset; under one lock with the program's own reads and resets, so none sees a peak lost or twice."""
    with _carry_lock:
        if stats is None:
            stats = _stats(torch, device)
        held = _pending.setdefault(device, [])
        held.append(stats)
        if len(held) >= CARRY_EVERY:
            _carry(device)
        torch._C._cuda_resetPeakMemoryStats(device)
    return stats


def _carry(device) -> dict | None:
    """The peaks every reset so far dropped on ``device``, folded into its carried peaks (under ``_carry_lock``);
    a layout the allocator's stats do not have is skipped, never an error in the program's own read."""
    held = _pending.pop(device, None)
    carried = _carried.get(device)
    if held:
        if carried is None:  # where the peaks are in the allocator's stats, found once (about 30 of them)
            carried = _carried[device] = {path: 0 for path in _peak_paths(held[0])}
        groups = _groups(carried)
        for stats in held:
            for stat, pools in groups:
                node = stats.get(stat)
                for pool, path in pools:
                    sub = node if pool is None or not isinstance(node, dict) else node.get(pool)
                    value = sub.get("peak") if isinstance(sub, dict) else None
                    if isinstance(value, int) and value > carried[path]:
                        carried[path] = value
    return carried


def _groups(carried: dict) -> list:
    """The peak paths by top-level stat: (stat, [(pool or None, path)])."""
    out: dict = {}
    for path in carried:
        out.setdefault(path[0], []).append((path[1] if len(path) == 3 else None, path))
    return list(out.items())


def _peak_paths(stats: dict, prefix: tuple = ()):
    for key, value in stats.items():
        if isinstance(value, dict):
            if isinstance(value.get("peak"), int):
                yield (*prefix, key, "peak")
            else:
                yield from _peak_paths(value, (*prefix, key))


def _fold(stats: dict, carried: dict) -> None:
    """The peaks carried over the resets, into a stats dict the program reads."""
    for path, peak in carried.items():
        node = stats
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(path[-1]), int):
            node[path[-1]] = max(node[path[-1]], peak)


def _fold_peaks_back(torch) -> None:
    """What the program reads of its peaks (torch.cuda's nested and flat stats, torch.accelerator's flat ones)
    holds the peaks the per-step resets dropped; its own reset drops them too."""
    for owner in (torch.cuda.memory, torch.cuda):
        _registry.patch(owner, "memory_stats_as_nested_dict", lambda original: stats_wrapper(torch, original))
        _registry.patch(owner, "reset_peak_memory_stats", lambda original: reset_wrapper(torch, original))
    accelerator = getattr(torch, "accelerator", None)
    for owner in (getattr(accelerator, "memory", None), accelerator):
        if owner is not None and hasattr(owner, "memory_stats") and hasattr(owner, "reset_peak_memory_stats"):
            _registry.patch(owner, "memory_stats", lambda original: stats_wrapper(torch, original, flat=True))
            _registry.patch(owner, "reset_peak_memory_stats", lambda original: reset_wrapper(torch, original))


def _index(torch, device) -> int | None:
    try:
        return torch.cuda._utils._get_device_index(device, optional=True)
    except Exception:  # noqa: BLE001 - the original call says what is wrong with it
        return None


def stats_wrapper(torch, original, flat: bool = False):
    def memory_stats(*args, **kwargs):
        stats = original(*args, **kwargs)
        if _carried or _pending:
            device = args[0] if args else kwargs.get("device", kwargs.get("device_index"))
            index = _index(torch, device)
            with _carry_lock:
                carried = dict(_carry(index) or {})
            if carried:
                _fold_flat(stats, carried) if flat else _fold(stats, carried)
        return stats

    return memory_stats


def reset_wrapper(torch, original):
    def reset_peak_memory_stats(*args, **kwargs):
        device = args[0] if args else kwargs.get("device", kwargs.get("device_index"))
        index = _index(torch, device)
        with _carry_lock:  # no peak read before the program's reset is carried past it
            _carried.pop(index, None)
            _pending.pop(index, None)
            return original(*args, **kwargs)

    return reset_peak_memory_stats


def _fold_flat(stats: dict, carried: dict) -> None:
    """The same, into torch's flattened stats (``allocated_bytes.all.peak``)."""
    for path, peak in carried.items():
        key = ".".join(path)
        if isinstance(stats.get(key), int):
            stats[key] = max(stats[key], peak)


# ---- lines ------------------------------------------------------------------------------------------------

_NOT_USER = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def _loop_function() -> tuple[str, str] | None:
    """(file, function) of the training loop: the first frame past torch and us, from the step boundary."""
    import torch

    skip = _NOT_USER + (os.path.dirname(torch.__file__) + os.sep,)
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(skip) or
                                 frame.f_code.co_filename.endswith("_registry.py")):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_code.co_name) if frame is not None else None


def _line_of(frames: list, loop, torch_dir: str) -> tuple[str, str] | None:
    """The loop's own line that made a block (where it has one), else the first line past torch."""
    first = None
    for f in frames:  # innermost first
        name = f.get("filename") or ""
        if loop and name == loop[0] and f.get("name") == loop[1]:
            return _named(name, f.get("line"))
        if first is None and name and not name.startswith(torch_dir) and not name.startswith(_NOT_USER) \
                and not name.startswith("<"):
            first = (name, f.get("line"))
    return _named(*first) if first else None


def _named(filename: str, line) -> tuple[str, str]:
    from nvtx_autotrace import sites  # imports torch: only once a block is named

    return f"{sites.shown(filename)}:{line}", linecache.getline(filename, int(line or 0)).strip()[:120]


def _live_blocks(torch) -> list[dict]:
    """The allocator's live blocks, from one snapshot."""
    return [b for seg in torch.cuda.memory._snapshot().get("segments", []) for b in seg.get("blocks", [])
            if b.get("state") == "active_allocated"]


def _live_by_line(torch, blocks: list[dict] | None = None) -> dict:
    """Bytes of live blocks per line (blocks allocated while history ran)."""
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    out: dict = {}
    loop = _state.get("loop")
    for block in _live_blocks(torch) if blocks is None else blocks:
        if block.get("frames"):
            where = _line_of(block["frames"], loop, torch_dir)
            if where:
                out[where] = out.get(where, 0) + int(block.get("requested_size") or block.get("size") or 0)
    return out


# ---- out of memory ----------------------------------------------------------------------------------------

def _attach_observer(torch) -> None:
    if _observer["attached"]:
        return
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return
    attach(_out_of_memory)
    _observer["attached"] = True


def _out_of_memory(device, requested, limit, device_free) -> None:
    """The allocator failed: what it asked for, what was live, and by which lines (written before the error; once
    a step: cuDNN's benchmark and a program's own batch-size search catch theirs and go on). ``limit``: the
    device's memory, or what a memory fraction allows."""
    if not _state or _state.get("oom_step") == steps.current_step():
        return
    _state["oom_step"] = steps.current_step()
    try:
        import torch

        a, ap, r, _rp = _read(torch, device)
        total = int(torch.cuda.get_device_properties(device).total_memory)
        record = {"step": steps.current_step(), "phase": _state.get("phase"), "requested_bytes": int(requested),
                  "allocated_bytes": a, "reserved_bytes": r, "peak_allocated_bytes": ap,
                  "device_used_bytes": total - int(device_free), "device_free_bytes": int(device_free),
                  "device_total_bytes": total, "allowed_bytes": int(limit) if 0 < int(limit) < total else None,
                  "largest": _largest(torch)}
        window_file.note("oom", **record)
        _backend.push(names.oom(record))
        _backend.pop()
    except Exception:  # noqa: BLE001 - the program's own error follows: ours must not replace it
        pass


def _largest(torch) -> list[dict]:
    """The largest live allocations: by line where history recorded them, else by block."""
    blocks = _live_blocks(torch)  # one snapshot, in the program's failing allocation
    by_line = _live_by_line(torch, blocks)
    if by_line:
        return [{"where": w, "code": c, "bytes": b}
                for (w, c), b in sorted(by_line.items(), key=lambda kv: -kv[1])[:TOP_LINES]]
    sizes = sorted((int(b.get("size") or 0) for b in blocks), reverse=True)
    return [{"where": None, "code": None, "bytes": s} for s in sizes[:TOP_LINES]]
