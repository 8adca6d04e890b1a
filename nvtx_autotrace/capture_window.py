"""Capture window at step boundaries: profile only steps N .. N+M-1.

``NVTX_AUTOTRACE_CAPTURE="N:M[:mode]"`` (set by ``nvtx-trace run --warmup-steps N
--steps M``) starts the capture when step N begins and stops it when step N+M
begins, using the step counter's boundary callbacks, so the window is cut exactly
between two steps. ``mode`` says how nsys is told:

- ``cuda``: ``cudaProfilerStart()`` / ``cudaProfilerStop()``, for
  ``nsys profile --capture-range=cudaProfilerApi`` (needs a CUDA build of torch);
- ``nvtx`` (default): a push/pop range named ``capture`` in the NVTX domain
  ``nvtx-trace``, for ``nsys profile -c nvtx -p capture@nvtx-trace
  --capture-range-end=stop``; works without a GPU (checked with nsys 2022.4).

With N = 0 the capture starts as soon as this is installed (before step 0). Only
the process that set the capture up acts: DataLoader workers forked from it
inherit the installed state but never reach a step boundary, and processes started
by ``multiprocessing`` (spawned workers) do nothing. The window opens once and is
independent of the patches: ``uninstall()``/reinstalling them leaves it alone.
"""

from __future__ import annotations

import multiprocessing
import os
import sys

from nvtx_autotrace import _registry, memory, steps
from nvtx_trace import names

ENV = names.CAPTURE_ENV
DOMAIN = names.CAPTURE_DOMAIN
RANGE = names.CAPTURE_RANGE
NSYS_NVTX_CAPTURE = names.NSYS_NVTX_CAPTURE  # the -p value that matches the range below
MODES = ("nvtx", "cuda", "time")  # time: no profiler to start or stop, only the window's step times (try)

_state = {"window": None, "started": False, "stopped": False, "remove": None, "pid": None, "exit": False}


def parse(text: str) -> tuple[int, int, str]:
    """``"N:M"``, ``"N:M:mode"`` or ``"N:M:mode:exit"`` -> (first step, step count, mode); ``exit`` (read by
    ``stops_after``) ends the program once the window closed."""
    parts = [p.strip() for p in str(text).split(":")]
    if len(parts) == 4 and parts[3] == "exit":
        parts = parts[:3]
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        first, count = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: expected N:M, N:M:mode or N:M:mode:exit (first step, step count)") \
            from None
    mode = parts[2].lower() if len(parts) == 3 and parts[2] else "nvtx"
    if first < 0 or count < 1:
        raise ValueError(f"{ENV}={text!r}: needs N >= 0 and M >= 1")
    if mode not in MODES:
        raise ValueError(f"{ENV}={text!r}: mode must be one of {', '.join(MODES)}")
    return first, count, mode


def safely(what: str, fn, mode: str) -> None:
    """The capture window must never stop the user's program: a failure is one warning, then nothing."""
    try:
        fn(mode)
    except Exception as exc:  # noqa: BLE001 - e.g. CPU-only torch: "Torch not compiled with CUDA enabled"
        _registry.warn_once(f"capture-{what}", f"cannot {what} the {mode} capture window ({type(exc).__name__}: "
                                              f"{exc}); the program runs on, the window may capture nothing "
                                              "(nvtx-trace run --capture-mode nvtx avoids CUDA)")


def start(mode: str) -> None:
    if mode == "time":
        return
    if mode == "cuda":
        import torch

        torch.cuda.cudart().cudaProfilerStart()
    else:
        import nvtx

        nvtx.push_range(RANGE, domain=DOMAIN)


def stop(mode: str) -> None:
    if mode == "time":
        return
    if mode == "cuda":
        import torch

        torch.cuda.synchronize()  # kernels of the last step inside the window
        torch.cuda.cudart().cudaProfilerStop()
    else:
        import nvtx

        nvtx.pop_range(domain=DOMAIN)


def repeat_instrumentation_record(step: int) -> None:
    """The budget's record (measured before the window opened) again, inside it: the analyzer needs it, and
    the pace of the steps just before the window (no CUDA tracing yet) tells it what the profiler costs.
    The settings record too, with its counters brought up to date."""
    from nvtx_autotrace import _backend, budget, settings

    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else None  # the report's title
    _backend.push(names.window({"first_step": step, "program": program}))  # whatever reads it: warm-up left out
    _backend.pop()
    record = budget.record_at_capture(step)
    if record is not None:
        budget.emit(record)
    settings.emit_if_read()
    memory.emit_lines()


def _on_boundary(step: int) -> None:
    window = _state["window"]
    if window is None or os.getpid() != _state["pid"]:
        return
    first, count, mode = window
    if step == first and not _state["started"]:
        memory.window_opening(step)
        safely("start", start, mode)
        _state["started"] = True
        safely("record", lambda _mode: repeat_instrumentation_record(step), mode)
    elif step >= first + count and _state["started"] and not _state["stopped"]:
        safely("stop", stop, mode)
        _state["stopped"] = True
        remove = _state["remove"]
        if remove:
            remove()
        if _state["exit"]:
            # The window is captured: the rest of a long run would add nothing to the report. SystemExit
            # leaves through the user's optimizer.step like a normal exit (finally blocks, workers shut down).
            import sys

            print(f"nvtx-trace: the program was stopped after step {step - 1}: its capture window "
                  f"(steps {first}-{first + count - 1}) is recorded (nvtx-trace run --keep-running lets it finish)",
                  file=sys.stderr, flush=True)
            raise SystemExit(0)


def install(spec: str | None = None) -> tuple[int, int, str] | None:
    """Arm the window from ``spec`` or ``$NVTX_AUTOTRACE_CAPTURE`` (idempotent). None when unset."""
    spec = os.environ.get(ENV) if spec is None else spec
    if not spec or _state["window"] is not None:
        return _state["window"]
    if multiprocessing.parent_process() is not None:  # a spawned worker: not the training process
        return None
    window = parse(spec)
    _state.update(window=window, pid=os.getpid(), started=False, stopped=False,
                  exit=str(spec).strip().endswith(":exit"))
    _state["remove"] = steps.on_step_boundary(_on_boundary)
    if not _state.get("noted"):
        import atexit

        _state["noted"] = True
        atexit.register(_ended)
    if window[0] == 0 or steps.current_step() >= window[0]:
        safely("start", start, window[2])
        _state["started"] = True
    return window


def _ended() -> None:
    """At exit, in the decisions file when the runner gave one: how many steps ran and whether the window
    opened (a window beyond the program's end is said so, not blamed on nsys)."""
    window = _state["window"]
    if window is None or os.getpid() != _state["pid"]:
        return
    from nvtx_autotrace.window_file import note

    note("ended", steps=steps.current_step(), opened=_state["started"], window=list(window[:2]))


def uninstall() -> None:
    """Disarm; a window still open is closed so the profiler sees a balanced range."""
    window = _state["window"]
    if window and _state["started"] and not _state["stopped"] and os.getpid() == _state["pid"]:
        try:
            stop(window[2])
        except Exception:
            pass
    if _state["remove"]:
        _state["remove"]()
    _state.update(window=None, started=False, stopped=False, remove=None, pid=None, exit=False)


def state() -> dict:
    """(for tests) the armed window and whether it started/stopped."""
    return {k: _state[k] for k in ("window", "started", "stopped")}
