"""The NVTX range-name contract between nvtx_autotrace (writer) and the analyzer (reader).

Both sides import this module, so a name can only change in one place. It must
stay free of torch and of any heavy import: the analyzer runs without torch and
the auto-instrumentation imports it inside every profiled process.

Every automatic range lives in the default NVTX domain and starts with a fixed
prefix, so the analyzer can tell it from a user's own ranges by name alone.

| range                          | example                                        | thread / process            |
|--------------------------------|------------------------------------------------|-----------------------------|
| training step                  | ``step 12``                                    | training thread             |
| wait for the next batch        | ``dataloader.next [train.py:41]``              | training thread             |
| batch fetch inside a worker    | ``dataloader.fetch [train.py:41] worker 1``    | the DataLoader worker       |
| that fetch's CPU demand        | ``dataloader.cpu 4100 us`` (inside the fetch)  | the DataLoader worker       |
| module forward                 | ``forward layer1.0.conv1 (Conv2d)``            | training thread             |
| root module forward            | ``forward (ResNet)``                           | training thread             |
| whole backward pass            | ``backward``                                   | training thread             |
| module backward                | ``backward layer1.0.conv1 (Conv2d)``           | autograd thread             |
| optimizer step / zero_grad     | ``optimizer.step (SGD)``                       | training thread             |
| the closure a step runs        | ``optimizer.closure (SGD)`` (inside the step)  | training thread             |
| host-to-device copy, its line  | ``copy.h2d 602112 B pageable non_blocking=0 at train.py:41`` | training thread |
| pin_memory()                   | ``pin_memory 602112 B``                        | any                         |
| host sync, and the line of it  | ``sync item at train.py:87``                   | training thread             |
| the instrumentation's own cost | ``nvtx_autotrace.instrumentation {json}``      | training thread (once)      |
| its cost calibration           | ``nvtx_autotrace.calibration``                 | training thread (once)      |
| the program's settings         | ``nvtx_autotrace.settings {json}``             | training thread (step 1, window start) |
| a step's GPU memory            | ``nvtx_autotrace.memory {json}``               | training thread (as the next step begins) |
| lines whose memory grew        | ``nvtx_autotrace.memory_lines {json}``         | training thread (window start) |
| an out-of-memory error         | ``nvtx_autotrace.oom {json}``                  | the thread that allocated |

The loader label in brackets is the creation site (``file:line``) of the
DataLoader, or the ``nvtx_name`` attribute a user set on it.
"""

from __future__ import annotations

import json
import re

STEP_PREFIX = "step "
LOADER_WAIT_PREFIX = "dataloader.next "
WORKER_FETCH_PREFIX = "dataloader.fetch "
WORKER_CPU_PREFIX = "dataloader.cpu "  # at a fetch's end, inside it: CPU time used or queued for (I/O waits are free)
FORWARD_PREFIX = "forward "
BACKWARD = "backward"
BACKWARD_PREFIX = "backward "
OPTIMIZER_STEP_PREFIX = "optimizer.step "
# optimizer.step(closure): the closure computes forward, loss and backward inside the step (Lightning, LBFGS)
OPTIMIZER_CLOSURE_PREFIX = "optimizer.closure "
ZERO_GRAD_PREFIX = "optimizer.zero_grad "
H2D_COPY_PREFIX = "copy.h2d "
PIN_MEMORY_PREFIX = "pin_memory "
SYNC_PREFIX = "sync "
INSTRUMENTATION_PREFIX = "nvtx_autotrace.instrumentation "
CALIBRATION = "nvtx_autotrace.calibration"
SETTINGS_PREFIX = "nvtx_autotrace.settings "
WINDOW_PREFIX = "nvtx_autotrace.window "  # the capture window opened at a step boundary, after warm-up
MEMORY_PREFIX = "nvtx_autotrace.memory "  # one step's allocator counters (nvtx_autotrace/memory.py)
MEMORY_LINES_PREFIX = "nvtx_autotrace.memory_lines "  # the loop's lines whose live memory grew in warm-up
OOM_PREFIX = "nvtx_autotrace.oom "  # the allocator ran out of memory: what was asked, what was live
ONCE_RECORDS = (INSTRUMENTATION_PREFIX, CALIBRATION, SETTINGS_PREFIX, WINDOW_PREFIX, MEMORY_LINES_PREFIX, OOM_PREFIX)
"""Records written once, not ranges of the program's work (the per-step memory record is a cost of every step)."""

# The capture window (nvtx-trace run --warmup-steps N --steps M): the variable nvtx_autotrace.capture_window
# reads, and the NVTX range it opens for nsys --capture-range=nvtx (domain "nvtx-trace").
CAPTURE_ENV = "NVTX_AUTOTRACE_CAPTURE"
CAPTURE_DOMAIN = "nvtx-trace"
CAPTURE_RANGE = "capture"
NSYS_NVTX_CAPTURE = f"{CAPTURE_RANGE}@{CAPTURE_DOMAIN}"  # nsys's --nvtx-capture value for that range
# The default window (nvtx-trace run without --steps or --full): the variable that arms
# nvtx_autotrace.auto_window, and the file where it appends its decisions for the runner.
AUTO_WINDOW_ENV = "NVTX_AUTOTRACE_AUTO_WINDOW"
WINDOW_FILE_ENV = "NVTX_AUTOTRACE_WINDOW_FILE"
# nvtx_autotrace's options as variables (nvtx_autotrace/options.py): NVTX_AUTOTRACE itself, then one
# NVTX_AUTOTRACE_<OPTION> each; run sets MODULE_DEPTH and BUDGET_PCT from its --autotrace-* flags.
AUTOTRACE_ENV = "NVTX_AUTOTRACE"
# nvtx-trace try: the knobs nvtx_autotrace applies (nvtx_autotrace/knobs.py), as a JSON object (nvtx_trace/knobs/)
TRY_ENV = "NVTX_AUTOTRACE_TRY"
FLOPS_ENV = "NVTX_AUTOTRACE_FLOPS"  # tune's first profile: count one warm-up step's model FLOPs (flops.py)
LOSSES_ENV = "NVTX_AUTOTRACE_LOSSES"  # try: the first N steps' losses, written to the window file


def autotrace_option_env(option: str) -> str:
    """``module_depth`` -> ``NVTX_AUTOTRACE_MODULE_DEPTH`` (``enabled`` is NVTX_AUTOTRACE itself)."""
    return AUTOTRACE_ENV if option == "enabled" else f"{AUTOTRACE_ENV}_{option.upper()}"


def parse_module_depth(value) -> int | None:
    """A module depth as both sides read it: auto (None: as deep as the budget allows), -1 (all), or N >= 0."""
    if value is None or str(value).strip().lower() == "auto":
        return None
    try:
        depth = int(str(value).strip())
    except (TypeError, ValueError):
        depth = -2
    if depth < -1:
        raise ValueError(f"{value!r}: expected auto, -1 (all modules) or a depth >= 0")
    return depth


def parse_budget_pct(value) -> float:
    """The module ranges' budget, a percentage of a plain step: > 0 and <= 100."""
    try:
        pct = float(value)
    except (TypeError, ValueError):
        pct = float("nan")
    if not 0 < pct <= 100:
        raise ValueError(f"{value!r}: expected a percentage of the step time, > 0 and <= 100")
    return pct


def step(index: int) -> str:
    return f"step {index}"


def loader_wait(loader: str) -> str:
    return f"dataloader.next [{loader}]"


def optimizer_closure(cls: str) -> str:
    return f"{OPTIMIZER_CLOSURE_PREFIX}({cls})"


def worker_fetch(loader: str, worker_id: int) -> str:
    return f"dataloader.fetch [{loader}] worker {worker_id}"


def worker_cpu(cpu_ns: int) -> str:
    """Two significant digits: enough to size workers, and few distinct names for the report to store."""
    us = max(0, cpu_ns) // 1000
    return f"{WORKER_CPU_PREFIX}{int(float(f'{us:.2g}'))} us"


def _module(prefix: str, path: str, cls: str) -> str:
    return f"{prefix}{path} ({cls})" if path else f"{prefix}({cls})"


def forward(path: str, cls: str) -> str:
    return _module(FORWARD_PREFIX, path, cls)


def module_backward(path: str, cls: str) -> str:
    return _module(BACKWARD_PREFIX, path, cls)


def optimizer_step(cls: str) -> str:
    return f"optimizer.step ({cls})"


def zero_grad(cls: str) -> str:
    return f"optimizer.zero_grad ({cls})"


def h2d_copy(nbytes: int, pinned: bool, non_blocking: bool, at: str | None = None) -> str:
    """``copy.h2d 602112 B pageable non_blocking=0``, with the line that asked where it is known (`` at x.py:41``)."""
    return (f"copy.h2d {nbytes} B {'pinned' if pinned else 'pageable'} non_blocking={int(bool(non_blocking))}"
            + (f" at {at}" if at else ""))


def pin_memory(nbytes: int) -> str:
    return f"pin_memory {nbytes} B"


def sync(what: str, at: str | None = None) -> str:
    """``sync item``, or with the line that asked for it: ``sync item at train.py:87``."""
    return f"sync {what}" + (f"{SYNC_SITE_SEP}{at}" if at else "")


SYNC_SITE_SEP = " at "
SYNC_SITE_RE = re.compile(r"^sync (?P<what>\S+) at (?P<where>.+:\d+)$")


def instrumentation(record: dict) -> str:
    """One range whose name carries what the instrumentation measured about its own cost (JSON)."""
    return _record(INSTRUMENTATION_PREFIX, record)


def window(record: dict) -> str:
    """One range, the first thing a capture window holds: the step it opened at (``first_step``), so that any
    reader of the report knows the steps before it ran outside the capture (the warm-up is already left out)."""
    return _record(WINDOW_PREFIX, record)


_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=str).encode  # made once


def _record(prefix: str, record: dict) -> str:
    """Every record range's text: the prefix, then its JSON (sorted keys, compact)."""
    return prefix + _ENCODE(record)


def memory(record: dict) -> str:
    """One step's GPU memory: allocated and reserved at its start, its peaks, the peak by backward and optimizer.
    Integers only, written every step: formatted directly (the JSON encoder cost 40 µs a step on an H200 host),
    the same text as ``_record``'s."""
    return MEMORY_PREFIX + "{" + ",".join(['"%s":%d' % kv for kv in sorted(record.items())]) + "}"


def memory_lines(record: dict) -> str:
    return _record(MEMORY_LINES_PREFIX, record)


def oom(record: dict) -> str:
    return _record(OOM_PREFIX, record)


def settings(record: dict) -> str:
    """One range whose name carries the program's settings (precision, optimizer, loaders...) as JSON."""
    return _record(SETTINGS_PREFIX, record)


# ---- reading side ---------------------------------------------------------

STEP_RE = re.compile(r"^(?:step|iteration|iter|train_step|batch)[ _#:]*(\d+)$", re.IGNORECASE)
"""Step ranges: the auto ``step N`` and the common user spellings (``iteration 3``, ``step_7``)."""

LOADER_WAIT_RE = re.compile(r"^dataloader\.next \[(?P<loader>.*)\]$")
WORKER_FETCH_RE = re.compile(r"^dataloader\.fetch \[(?P<loader>.*)\] worker (?P<worker>\d+)$")
WORKER_CPU_RE = re.compile(r"^dataloader\.cpu (?P<us>\d+) us$")
MODULE_RE = re.compile(r"^(?P<phase>forward|backward) (?:(?P<path>\S+) )?\((?P<cls>[^()]+)\)$")
H2D_COPY_RE = re.compile(r"^copy\.h2d (?P<bytes>\d+) B (?P<kind>pinned|pageable) non_blocking=(?P<nb>[01])"
                         r"(?: at (?P<where>.+:\d+))?$")
SYNC_RE = re.compile(r"^sync (?P<what>\S+)(?: at (?P<where>.+:\d+))?$")  # with its line, or (older) without

DEFAULT_USER_LOADER_PATTERN = (r"(?i)^(data|data ?load(er|ing)?|load(ing)?[ _]?(data|batch)|next[ _]?batch"
                               r"|fetch[ _]?batch|get[ _]?batch|wait[ _]?(for[ _])?(data|batch))$")
"""User ranges that mean "waiting for the next batch" (``--loader-pattern`` overrides it)."""


def is_auto_range(name: str) -> bool:
    """True for any range nvtx_autotrace writes (used to tell them from user ranges)."""
    return bool(
        STEP_RE.match(name) and name.startswith(STEP_PREFIX)
        or name == BACKWARD
        or name.startswith((LOADER_WAIT_PREFIX, WORKER_FETCH_PREFIX, WORKER_CPU_PREFIX, FORWARD_PREFIX,
                            BACKWARD_PREFIX, OPTIMIZER_STEP_PREFIX, OPTIMIZER_CLOSURE_PREFIX, ZERO_GRAD_PREFIX,
                            H2D_COPY_PREFIX, PIN_MEMORY_PREFIX, SYNC_PREFIX, INSTRUMENTATION_PREFIX, CALIBRATION,
                            SETTINGS_PREFIX, WINDOW_PREFIX, MEMORY_PREFIX, MEMORY_LINES_PREFIX, OOM_PREFIX))
    )
