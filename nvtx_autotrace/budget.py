"""Which modules get ranges: as many as fit in a budget of the step time (default 0.5 %).

Every module range costs CPU time on the training thread, and a forward range
that also marks its backward costs several times more (two autograd pre-hooks,
run by the autograd engine; benchmarks/range_costs.py). A 12-layer transformer
calls about 150 modules per micro-batch: ranging all of them made GPT-2 training
25-29 % slower. So the depth of module ranges is chosen per program, at run time:

* step 0 (warm-up, compilation): no module ranges at all;
* at its end, the models are found: top-level modules holding the lead
  optimizer's parameters (one scan of the garbage collector's objects);
* steps 1-2: each module's calls are counted (a dict lookup a call), and the
  step time without module ranges is measured;
* then the per-range costs are measured in this very process, under the
  attached profiler (``calibrate``), and the deepest backward depth, then the
  deepest forward depth, whose calls x costs fit in ``budget_pct`` of that step
  time are chosen. Module ranges start with step 3.

What was measured and chosen is written into the trace as one range,
``nvtx_autotrace.instrumentation {json}``, which the analyzer reads to report
(and subtract) the instrumentation's own cost.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from nvtx_autotrace import _backend, _registry, autograd, classwrap, modules, steps
from nvtx_trace import names

CLOCK = time.perf_counter_ns  # wall time of the calling thread: what the training step pays
COUNT_STEPS = 2  # steps whose module calls are counted and timed before ranges are chosen
FIND_ROOTS_UNTIL = 5  # give up looking for a model after this many steps
MAX_REFERENCE_STEPS = 64  # steps timed after the choice, for the pace outside a capture window


def find_roots(optimizer=None) -> list[torch.nn.Module]:
    """Top-level modules (no other module's child) holding parameters the optimizer trains.

    Without an optimizer (``mark_step()`` loops), any parameter that requires grad counts.
    """
    if optimizer is not None:
        wanted = {id(p) for g in getattr(optimizer, "param_groups", []) for p in g.get("params", [])}
    else:
        wanted = None
    # Modules whose __init__ failed before Module.__init__ (kept alive by a traceback) have no _modules.
    found = [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module) and "_modules" in vars(o)]
    return roots_among(found, wanted)


def roots_among(found: list, wanted: set | None) -> list:
    """The modules of ``found`` that are no other's child and hold a parameter in ``wanted`` (ids), or one that
    requires grad when ``wanted`` is None."""
    children = {id(c) for m in found for c in vars(m)["_modules"].values() if c is not None}
    roots = []
    for m in found:
        if id(m) in children:
            continue
        try:
            params = list(m.parameters())
        except Exception:  # noqa: BLE001 - a broken or half-built module is no model of ours
            continue
        if any((id(p) in wanted) if wanted is not None else p.requires_grad for p in params):
            roots.append(m)
    return roots


def compiled(module) -> bool:
    """Inside torch.compile'd code our wrappers never run, and patching a class that Dynamo has
    traced would fail its guards and recompile: such modules (and their children) are left alone."""
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


class Budget:
    """Step-boundary state machine: find models, count and time, calibrate, choose, range."""

    def __init__(self, budget_pct: float, backward_modules: bool):
        self.budget_pct = budget_pct
        self.backward_modules = backward_modules
        self.count_from = None  # first counted step
        self.times: list[float] = []
        self.t_last = None
        self.record: dict | None = None
        self.discovery_ns = 0
        self.done = False
        self.marks: dict[int, float] = {}  # step -> when it began, once ranges are chosen (reference steps)

    def on_boundary(self, n: int) -> None:
        """Step ``n`` begins (step n-1's optimizer step just ended)."""
        if self.done:
            classwrap.keep_only(lambda s: True)  # modules freed since (a new model in a sweep): unwrap their classes
            self.mark(n)
            return
        now = time.perf_counter()
        if self.count_from is None:
            t0 = time.perf_counter_ns()
            roots = find_roots(steps.lead_optimizer())
            self.discovery_ns = time.perf_counter_ns() - t0
            if roots:
                self._count(roots)
                self.count_from, self.t_last = n, time.perf_counter()
            elif n >= FIND_ROOTS_UNTIL:
                self.done = True
                _registry.warn_once("budget", "no model found (no module holds the optimizer's parameters); "
                                              "no module ranges")
            return
        self.times.append(now - self.t_last)
        self.t_last = now
        if len(self.times) >= COUNT_STEPS:
            self.done = True
            try:
                self._choose()
            except Exception as exc:  # noqa: BLE001 - no module ranges rather than a broken training step
                classwrap.clear()
                _registry.warn_once("budget", f"module ranges switched off: choosing them failed "
                                              f"({type(exc).__name__}: {exc})")
            self.mark(n)  # after the calibration: the reference steps start clean

    def mark(self, n: int) -> None:
        self.marks.setdefault(n, time.perf_counter())
        if len(self.marks) > MAX_REFERENCE_STEPS + 1:  # the latest steps are the ones "just before" a window
            del self.marks[min(self.marks)]

    def reference(self, until: int) -> tuple[int, int]:
        """(median ns, count) of the steps run with the chosen ranges before step ``until``: before a capture
        window opens they run without the profiler's CUDA tracing, so they show the program's own pace."""
        self.mark(until)
        durations = sorted(self.marks[k + 1] - self.marks[k] for k in self.marks if k + 1 in self.marks and k < until)
        if len(durations) < 2:
            return 0, len(durations)
        return int(statistics.median(durations) * 1e9), len(durations)

    def _count(self, roots) -> None:
        for root in roots:
            skip = {id(c) for m in root.modules() if compiled(m) for c in m.modules()}
            if type(root).__name__ == "OptimizedModule":
                skip.discard(id(root))  # its __call__ is wrapped: one range for the compiled model
            for entry in modules.build_table(root).values():
                if id(entry.module) in skip:
                    continue
                slot = classwrap.add(entry.module, entry.forward, entry.backward, entry.depth)
                if slot is not None:
                    slot.counting = True

    def _choose(self) -> None:
        step_ns = min(self.times) * 1e9
        t0 = time.perf_counter_ns()
        unit = calibrate()
        unit["calibration_ns"] = time.perf_counter_ns() - t0
        counted = classwrap.slots()
        for s in counted:
            s.counting = False
        per_step = {id(s): (s.calls / len(self.times), s.grad_calls / len(self.times)) for s in counted}
        budget_ns = step_ns * self.budget_pct / 100
        depths = sorted({s.depth for s in counted})

        def cost(bwd_depth: int, fwd_depth: int) -> float:
            total = 0.0
            for s in counted:
                calls, grad_calls = per_step[id(s)]
                if s.depth <= bwd_depth and self.backward_modules:
                    total += grad_calls * unit["module_backward_ns"] + calls * unit["module_forward_ns"]
                elif s.depth <= fwd_depth:
                    total += calls * unit["module_forward_ns"]
            return total

        bwd = max((d for d in depths if cost(d, d) <= budget_ns), default=-1) if self.backward_modules else -1
        fwd = max((d for d in depths if d >= bwd and cost(bwd, d) <= budget_ns), default=bwd)
        for s in counted:
            s.ranged = s.depth <= fwd
            s.with_backward = s.depth <= bwd and self.backward_modules
        classwrap.keep_only(lambda s: s.ranged)
        ranged = [s for s in counted if s.ranged]
        self.record = {
            "method": "class forward wrappers, depth chosen by budget",
            "budget_pct": self.budget_pct,
            "plain_step_ns": int(step_ns),
            "forward_depth": fwd,
            "backward_depth": bwd,
            "max_depth": max(depths, default=-1),
            "modules_ranged": len(ranged),
            "module_calls_per_step": round(sum(per_step[id(s)][0] for s in ranged), 2),
            "module_calls_per_step_all": round(sum(c for c, _ in per_step.values()), 2),
            "estimated_module_cost_ns_per_step": int(cost(bwd, fwd)),
            "discovery_ns": self.discovery_ns,
            **unit,
        }
        emit(self.record)


def emit(record: dict) -> None:
    _backend.push(names.instrumentation(record))
    _backend.pop()


class _Probe(torch.nn.Module):
    """The smallest real module: one op, one autograd node, on a tensor (16 KiB) big enough that
    calls between ranges touch memory as real layers do (a 16-byte probe under-reported 2-2.5x)."""

    def forward(self, x):
        return torch.tanh(x)


def calibrate(n_modules: int = 16, pairs: int = 80, elements: int = 1 << 12) -> dict:
    """Per-range costs, measured now, in this process, under the attached profiler (ns).

    A chain of one-op probe modules runs with and without ranges, alternating call by call
    (``pairs`` times, ABBA order), and the median paired difference is the cost: on a shared
    machine whose speed drifts, short paired calls are what stays comparable.
    """
    # optimizer.step() may run under no_grad, inference_mode or another default device
    with torch.inference_mode(False), torch.enable_grad(), torch.device("cpu"):
        probes = [_Probe() for _ in range(n_modules)]
        x0 = torch.ones(elements, requires_grad=True, dtype=torch.float32)
        return _calibrate(probes, x0, n_modules, pairs)


def _calibrate(probes, x0, n_modules: int, pairs: int) -> dict:

    def forwards():
        with torch.no_grad():
            x = x0
            for p in probes:
                x = p(x)

    def forward_backward():
        x = x0 * 1.0
        for p in probes:
            x = p(x)
        torch.autograd.grad(x.sum(), x0)  # not Tensor.backward: that one is ours and would range it

    slots = [classwrap.add(p, names.CALIBRATION, names.CALIBRATION, 0) for p in probes]

    def configure(ranged: bool, backward: bool):
        for slot in slots:
            slot.ranged, slot.with_backward = ranged, backward

    def paired(fn, base: tuple, more: tuple) -> float:
        diffs = []
        for i in range(pairs):
            t = {}
            for which, setting in ((("a", base), ("b", more)) if i % 2 == 0 else (("b", more), ("a", base))):
                configure(*setting)
                t0 = CLOCK()
                fn()
                t[which] = CLOCK() - t0
            diffs.append(t["b"] - t["a"])
        return statistics.median(diffs) / n_modules

    def ranges():
        for _ in range(n_modules):
            _backend.push(names.CALIBRATION)
            _backend.pop()

    try:
        forward_backward()  # warm
        fwd = paired(forwards, (False, False), (True, False))
        bwd = paired(forward_backward, (True, False), (True, True))
        t0 = CLOCK()
        for _ in range(pairs):
            ranges()
        rng = (CLOCK() - t0) / (pairs * n_modules)
        autograd.close_all()
    finally:
        for p in probes:
            classwrap._slots.pop(id(p), None)
        classwrap.keep_only(lambda s: True)
    return {"module_forward_ns": max(0, int(fwd)), "module_backward_ns": max(0, int(bwd)), "range_ns": int(rng)}


_current: Budget | None = None


def install(budget_pct: float, backward_modules: bool) -> None:
    global _current
    _current = Budget(budget_pct, backward_modules)
    remove = steps.on_step_boundary(_current.on_boundary)
    _registry.on_undo(remove)
    _registry.on_undo(classwrap.clear)


def current_record() -> dict | None:
    """What the budget measured and chose (None until step 3 begins)."""
    return _current.record if _current is not None else None


def record_at_capture(step: int) -> dict | None:
    """The record, plus the pace of the steps run between the choice and the capture window opening at ``step``."""
    record = current_record()
    if record is None:
        return None
    ns, n = _current.reference(step)
    return {**record, "outside_capture_steps": n, **({"outside_capture_step_ns": ns} if ns else {})}
