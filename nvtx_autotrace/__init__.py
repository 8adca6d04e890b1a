"""NVTX ranges for a PyTorch training script, with no change to the script.

``import nvtx_autotrace`` (or ``python -m nvtx_autotrace train.py ...``) installs
them: batch waits and worker fetches, module forwards and backwards, optimizer
steps, ``step N``, host-to-device copies and host syncs, named as
``nvtx_trace.names`` says. By default (``NVTX_AUTOTRACE=auto``) the ranges are
only installed when a profiler is attached (nsys sets ``NVTX_INJECTION64_PATH``);
otherwise only the step counter runs, which costs a few µs per optimizer step.
See docs/autotrace.md for options and costs.
"""

from __future__ import annotations

import os
import threading

from nvtx_autotrace import _backend, _registry, steps
from nvtx_autotrace.options import Options
from nvtx_autotrace.steps import current_step, on_step_boundary
from nvtx_trace import names

__all__ = ["install", "uninstall", "is_installed", "options", "current_step", "on_step_boundary",
           "mark_step", "Options"]

_options: Options | None = None
_ranges_on = False
_lock = threading.RLock()


def install(**overrides) -> Options:
    """Install the patches (idempotent). Keyword options override ``NVTX_AUTOTRACE*`` variables.

    Installing again with different options reinstalls; with the same, does nothing.
    """
    global _options, _ranges_on
    opts = Options.from_env(**overrides)
    with _lock:
        if _options is not None:
            if opts == _options:
                return opts
            uninstall()
        if opts.enabled == "0":
            return opts
        ranges = opts.enabled == "1" or (_backend.injection_present() and not os.environ.get("NVTX_DISABLE"))
        _install(opts, ranges)
        _options, _ranges_on = opts, ranges
    return opts


_test_backend = None


def _install(opts: Options, ranges: bool) -> None:
    from nvtx_autotrace import optim

    _select_backend(ranges)
    if not ranges:  # no profiler: keep only the step counter, ranges go nowhere
        steps.configure(active=True, emit=False)
        optim.install(emit_ranges=False)
        return
    from nvtx_autotrace import autograd, budget, copies, dataloader, memory, modules, settings, sites, syncs

    steps.configure(active=True, emit=opts.steps)
    if opts.memory:  # first of the step-boundary callbacks: a window's last step is recorded before it closes
        memory.install()
    if opts.settings:
        settings.install()
    optim.install(emit_ranges=opts.optimizer, note_zero_grad=settings.saw_zero_grad if opts.settings else None)
    autograd.install(emit_backward=True)
    _registry.on_undo(sites.forget_modules)
    if opts.modules and opts.module_depth is None:
        budget.install(opts.budget_pct, opts.backward_modules)
    elif opts.modules:
        modules.install(opts.module_depth, opts.backward_modules)
        _registry.on_undo(steps.on_step_boundary_once(1, lambda: budget.emit({
            "method": f"global module hooks, depth {opts.module_depth} (set by hand)",
            "forward_depth": "all" if opts.module_depth < 0 else opts.module_depth,
            "backward_depth": ("all" if opts.module_depth < 0 else opts.module_depth) if opts.backward_modules else -1})))
    if opts.dataloader:
        dataloader.install(_worker_options(opts))
    copies.install(copies=opts.copies, syncs=opts.syncs)
    if opts.syncs:
        syncs.install()


def _select_backend(ranges: bool) -> None:
    if _test_backend is not None:
        _backend.use(_test_backend)
    elif not ranges:
        _backend.use("none")
    else:
        try:
            _backend.use("nvtx")
        except ImportError:
            _registry.warn_once("nvtx", "the `nvtx` package is missing (pip install nvtx); no ranges")
            _backend.use("none")


def use_backend(backend) -> None:
    """Send ranges to ``backend`` (a ``_backend.Recorder``), or back to normal with None. For tests."""
    global _test_backend
    _test_backend = backend
    if _options is not None:
        _select_backend(_ranges_on)


def _worker_options(opts: Options) -> dict:
    d = {k: getattr(opts, k) for k in opts.__dataclass_fields__}
    d["enabled"] = opts.enabled
    return d


def uninstall() -> None:
    """Remove every patch and hook, restoring the original attributes; end open ranges."""
    global _options, _ranges_on
    with _lock:
        steps.close_open_range()
        _registry.undo_all()
        steps.configure(active=False, emit=False)
        steps.reset()
        if _test_backend is None:
            _backend.use("none")
        _options, _ranges_on = None, False


def is_installed() -> bool:
    return _options is not None


def ranges_enabled() -> bool:
    """True when ranges are emitted (a profiler is attached, or NVTX_AUTOTRACE=1)."""
    return _ranges_on


def options() -> Options | None:
    return _options


def mark_step() -> int:
    """Declare a step boundary yourself (loops without an optimizer). Returns the new step index."""
    return steps.boundary()


def _after_fork_in_child() -> None:
    steps._lock = threading.Lock()
    steps.reset(steps.current_step())  # the parent's open step range is not the child's to end


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

try:
    install()
except ValueError as exc:  # a malformed NVTX_AUTOTRACE_* value must not kill the training run
    _registry.warn_once("env", f"not installed: {exc}")

if os.environ.get(names.TRY_ENV):  # nvtx-trace try: the knobs that apply a fix without editing the script
    try:
        from nvtx_autotrace import knobs as _knobs
        from nvtx_trace import knobs as _declared

        _knobs.install(_declared.from_json(os.environ[names.TRY_ENV]))
    except ValueError as exc:
        _registry.warn_once("try", f"no knob applied: {names.TRY_ENV}: {exc}")

if os.environ.get(names.LOSSES_ENV):  # nvtx-trace try: the losses of the first steps, for the numerics check
    from nvtx_autotrace import losses as _losses

    try:
        _losses.install(int(os.environ[names.LOSSES_ENV]))
    except ValueError as exc:
        _registry.warn_once("losses", f"losses not recorded: {names.LOSSES_ENV}: {exc}")

if os.environ.get(names.FLOPS_ENV):  # nvtx-trace tune: one warm-up step's model FLOPs, in the settings record
    from nvtx_autotrace import flops as _flops

    _flops.install()

if os.environ.get(names.CAPTURE_ENV):  # capture window (nvtx-trace run --warmup-steps/--steps)
    from nvtx_autotrace import capture_window as _capture_window

    try:
        _capture_window.install()
    except ValueError as exc:
        _registry.warn_once("capture", f"no capture window: {exc}")

if os.environ.get(names.AUTO_WINDOW_ENV):  # default window of nvtx-trace run (no --steps, no --full)
    from nvtx_autotrace import auto_window as _auto_window

    try:
        _auto_window.install()
    except ValueError as exc:
        _registry.warn_once("capture", f"no capture window: {exc}")
