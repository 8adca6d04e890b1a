"""The default capture window of ``nvtx-trace run``: skip warm-up until the step pace settles, profile
enough steps to be representative, then end the program, so that any script answers in minutes.

``NVTX_AUTOTRACE_AUTO_WINDOW="mode[:exit]"`` arms it (``mode``: nvtx or cuda, as in ``capture_window``).
Measured from the H100 samples in sample_reports/ (step ranges of ResNet-50/18, GPT-2, DDP):
step 0 takes 1.6-12 s (cuDNN autotuning, allocator growth, compilation) and steps 1-3 run on batches
the DataLoader prefetched, 2-3x faster than the pace that follows. So:

- warm-up ends at the first step boundary where the mean of the last 4 steps is within 20 % of the
  mean of the 4 before (step 0 never counts): step 9-14 on every sample, whose medians after that
  point are within 5 % of the whole run's; at the latest WARMUP_MAX_S after step 0 ended;
- the window then runs until it holds MIN_STEPS steps and MIN_SECONDS, or MAX_SECONDS with at least
  FLOOR_STEPS (export and analysis cost about 0.8 s per captured second of ResNet-50 on an H100); a timed run
  (mode ``time``: try's and tune's plain runs, no profile to fill) needs only TIMED_MIN_SECONDS, as each trial
  repeats and alternates its runs (a stage's time is mostly its runs: 2 s less each);
- distributed ranks (WORLD_SIZE > 1) cannot agree on a time, so they use fixed step counts
  (DIST_WARMUP, DIST_STEPS): every rank stops after the same step, none waits in a collective;
- no step boundary within NO_STEP_S (no optimizer, no mark_step): a time window of MAX_SECONDS,
  from then on; the analyzer infers steps from the rhythm of the work.

Each decision is appended as one JSON line to ``$NVTX_AUTOTRACE_WINDOW_FILE`` (per process): the runner
turns it into the line saying which steps were profiled and why.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time

from nvtx_autotrace import _registry, capture_window, memory, steps
from nvtx_autotrace.window_file import note
from nvtx_trace import names

ENV = names.AUTO_WINDOW_ENV
BLOCK = 4  # steps per block compared for "settled"
SETTLED = 0.20  # the last block's mean within this fraction of the block before
MIN_WARMUP = 5
WARMUP_MAX_S = 30.0
MIN_STEPS, MIN_SECONDS = 20, 5.0
TIMED_MIN_SECONDS = 3.0
MAX_SECONDS, FLOOR_STEPS = 20.0, 3
DIST_WARMUP, DIST_STEPS = 10, 20
NO_STEP_S = 60.0

_state: dict = {}
_lock = threading.Lock()  # the timer thread and the training thread both may open the window: one does


def _distributed() -> bool:
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def settled_at(times: list[float]) -> bool:
    """Whether the step pace settled, from the boundary times of steps 1.. (times[k]: when step k began)."""
    durations = [b - a for a, b in zip(times[1:], times[2:])]  # steps 1..n-1
    if len(durations) < 2 * BLOCK:
        return False
    before, last = durations[-2 * BLOCK:-BLOCK], durations[-BLOCK:]
    mean_before = sum(before) / BLOCK
    return mean_before > 0 and abs(sum(last) / BLOCK - mean_before) <= SETTLED * mean_before


def _warmup_over(n: int, now: float) -> str | None:
    times = _state["times"]
    if _state["distributed"]:
        return f"distributed run: a fixed warm-up of {DIST_WARMUP} steps on every rank" if n >= DIST_WARMUP else None
    if n < MIN_WARMUP:
        return None
    if settled_at(times):
        return f"the step pace settled (mean of steps {n - BLOCK}-{n - 1} within {SETTLED:.0%} of the {BLOCK} before)"
    if now - times[1] >= WARMUP_MAX_S:
        return f"warm-up capped at {WARMUP_MAX_S:.0f} s after step 0 (the pace had not settled)"
    return None


def _window_full(k: int, elapsed: float) -> bool:
    if _state["distributed"]:
        return k >= DIST_STEPS
    least = TIMED_MIN_SECONDS if _state.get("mode") == "time" else MIN_SECONDS
    return (k >= MIN_STEPS and elapsed >= least) or (elapsed >= MAX_SECONDS and k >= FLOOR_STEPS)


def _on_boundary(n: int) -> None:
    if os.getpid() != _state.get("pid") or _state["phase"] not in ("warmup", "window"):
        return
    now = time.perf_counter()
    while len(_state["times"]) <= n:  # times[k]: when step k began
        _state["times"].append(now)
    graphs = _compiled_graphs()
    while len(_state.setdefault("graphs", [])) <= n:  # graphs[k]: Dynamo's graphs made by when step k began
        _state["graphs"].append(graphs)
    mode = _state["mode"]
    if _state["phase"] == "warmup":
        with _lock:
            why = _warmup_over(n, now) if _state["phase"] == "warmup" else None
            if why:
                _state["phase"] = "opening"
        if why:
            memory.window_opening(n)
            capture_window.safely("start", capture_window.start, mode)
            capture_window.safely("record", lambda _m: capture_window.repeat_instrumentation_record(n), mode)
            # counted from when the capture runs: starting it can take nsys a good part of a second
            _state.update(phase="window", first=n, opened=time.perf_counter())
            times = _state["times"]
            note("opened", step=n, why=why, at_s=round(now - _state["installed"], 3),
                 first_step_s=round(times[1] - _state["installed"], 3) if len(times) > 1 else None,
                 installed_at=_state["installed_at"])
        return
    k, elapsed = n - _state["first"], now - _state["opened"]
    if _window_full(k, elapsed):
        capture_window.safely("stop", capture_window.stop, mode)
        _state["phase"] = "done"
        first, times = _state["first"], _state["times"]
        made = _state["graphs"]
        note("closed", step=n, steps=k, seconds=round(elapsed, 3), stopping=_state["exit"],
             at_s=round(now - _state["installed"], 3),
              step_ms=[round((b - a) * 1000, 3) for a, b in zip(times[first:n], times[first + 1:n + 1])],
              compiled=[i for i in range(n - first) if made[first + i + 1] > made[first + i]],
              peak_allocated_bytes=memory.peak_allocated())
        if _state["exit"]:
            what = "timed" if mode == "time" else "recorded"
            print(f"nvtx-trace: the program was stopped after step {n - 1}: its {'timing' if mode == 'time' else 'capture'}"
                  f" window (steps {_state['first']}-{n - 1}) is {what} (--keep-running lets it finish)",
                  file=sys.stderr, flush=True)
            if mode == "time" and not _state["distributed"]:
                _leave_now()
            raise SystemExit(0)


def _leave_now() -> None:
    """A timed run (try, tune) has given all it is for once its window closed: nobody reads what the program
    would do next, and its exit (DataLoader workers joined, compile pools and CUDA torn down) took 4.5-4.8 s of a
    16-s run on an H200 host. It leaves at once, as a kill would; the runner ends what it leaves (its workers)
    by process group. Not in a profile (nsys writes its report as the process exits) nor in a torchrun job (its
    ranks stop together, through their launcher)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream: nothing to keep
            pass
    os._exit(0)


def _compiled_graphs() -> int:
    """Graphs torch.compile has made so far (0 where Dynamo was never imported): a step in which one was made
    paid for its compilation (a new shape, ``model.eval()``, a recompile), which no later step pays again."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        return int(dynamo.counters["stats"]["unique_graphs"]) if dynamo is not None else 0
    except Exception:  # a torch whose counters differ: no step is called a compiling one
        return 0


def _no_steps() -> None:
    """Timer thread: no step boundary yet, so profile a stretch of time instead, then end the program."""
    with _lock:
        if _state.get("phase") != "warmup" or len(_state["times"]) > 1 or os.getpid() != _state.get("pid"):
            return
        _state["phase"] = "timed"
    mode, started = _state["mode"], time.perf_counter()
    capture_window.safely("start", capture_window.start, mode)
    note("opened", step=None, why=f"no training step was seen in the first {NO_STEP_S:.0f} s: a time window "
          f"of {MAX_SECONDS:.0f} s", at_s=round(started - _state["installed"], 3))
    time.sleep(MAX_SECONDS)
    capture_window.safely("stop", capture_window.stop, mode)
    note("closed", step=None, steps=None, seconds=round(time.perf_counter() - started, 3), stopping=_state["exit"])
    if _state["exit"]:
        print(f"nvtx-trace: the program was stopped after its {MAX_SECONDS:.0f} s capture window "
              "(nvtx-trace run --keep-running lets it finish)", file=sys.stderr, flush=True)
        _raise_in_main_thread()


def _raise_in_main_thread() -> None:
    """SystemExit in the main thread, where the program runs: it leaves like a normal exit (finally blocks,
    workers shut down), at its next Python instruction."""
    import ctypes

    ident = threading.main_thread().ident
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(SystemExit))


def _ended() -> None:
    """At exit: how far the program got; a window still open gives the step times it holds (try's timing)."""
    if os.getpid() != _state.get("pid"):
        return
    times, extra = _state["times"], {}
    if _state["phase"] == "window" and len(times) > _state["first"] + 1:
        extra["step_ms"] = [round((b - a) * 1000, 3) for a, b in zip(times[_state["first"]:], times[_state["first"] + 1:])]
    note("ended", steps=len(times) - 1, phase=_state["phase"],
          at_s=round(time.perf_counter() - _state["installed"], 3), **extra)


def _launcher() -> bool:
    """torchrun's (or torch.distributed.launch's) own process imports torch but never trains: a window there
    would be a time window, and stopping it would stop the ranks it supervises."""
    main = os.path.basename(sys.argv[0] if sys.argv else "")
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return main == "torchrun" or getattr(spec, "name", "") in ("torch.distributed.run", "torch.distributed.launch")


def install(spec: str | None = None) -> bool:
    """Arm the default window from ``spec`` or ``$NVTX_AUTOTRACE_AUTO_WINDOW`` (once per process)."""
    spec = os.environ.get(ENV) if spec is None else spec
    if not spec or _state or multiprocessing.parent_process() is not None or _launcher():
        return False
    parts = spec.strip().split(":")
    mode = parts[0] or "nvtx"
    if mode not in capture_window.MODES or parts[1:] not in ([], ["exit"]):
        raise ValueError(f"{ENV}={spec!r}: expected nvtx, cuda, time, or one of them with :exit")
    now = time.perf_counter()
    _state.update(pid=os.getpid(), mode=mode, exit=parts[1:] == ["exit"], phase="warmup", times=[now],
                  installed=now, installed_at=time.time(), distributed=_distributed())
    _registry.on_undo(steps.on_step_boundary(_on_boundary))
    import atexit

    atexit.register(_ended)
    timer = threading.Timer(NO_STEP_S, _no_steps)
    timer.daemon = True
    timer.start()
    return True
