"""Does the CPU keep the GPU waiting: long gaps with a CPU cause, or kernels launched too slowly to fill it?"""

from __future__ import annotations

from nvtx_trace.analyzer.basis import CPU_CAUSES, of_window, own_cost_note, profiler_unmeasured
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.gpu_idle import CAUSE_FIXES
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct


def _findings(analysis, basis) -> list[Finding]:
    return _cpu_overhead(analysis, basis) + _launch_bound(analysis, basis)


def _optimizer_loop(basis) -> bool:
    """The optimizer finding counts the GPU idle while optimizer.step runs (a per-parameter loop, or a foreach
    optimizer on a launch-bound step: fused=True removes that idle)."""
    return any(f.kind == "optimizer" and f.evidence.get("host_bound") for f in basis.found)


def _optimizer_loop_idle(analysis, basis) -> int:
    """The GPU idle in short gaps while a per-parameter optimizer launches its kernels, when the optimizer finding
    counts it (0 otherwise): impacts stay disjoint, and the specific cause outranks "launches cannot keep up"."""
    if not _optimizer_loop(basis):
        return 0
    inside = analysis.optimizer["gpu_idle_ns_per_step"] * len(analysis.steps.steady)
    return int(max(0.0, inside - basis.cause_ns.get("optimizer", 0)))


def _after_syncs(basis, device_id: int) -> int:
    """Short-gap idle the sync finding counts (gaps that opened while the host waited in a sync it names)."""
    return sum((f.evidence.get("short_idle_ns") or {}).get(device_id, 0) for f in basis.found if f.kind == "sync")


def _allocator_malloc_ns(basis) -> int:
    """Slow cudaMalloc time an allocator finding counts (its calls are also slow CUDA API calls)."""
    return sum(f.evidence.get("malloc_ns", 0) for f in basis.found if f.kind == "allocator")


def _cpu_overhead(analysis, basis) -> list[Finding]:
    out = []
    loop = _optimizer_loop(basis)
    for cause in CPU_CAUSES:
        if cause == "optimizer" and loop:
            continue  # the optimizer finding counts it
        raw = basis.cause_ns.get(cause, 0)
        if cause == "cuda_api":
            raw = max(0, raw - _allocator_malloc_ns(basis))
        ns = int(raw * basis.keep)
        if ns < THRESHOLDS["min_impact_ns"] or ns < THRESHOLDS["cause_fraction"] * basis.gpu_ns:
            continue
        label = dict(zip(analysis.window_causes["cause"], analysis.window_causes["label"]))[cause]
        out.append(Finding(
            recommend=_cuda_graphs(analysis) if cause in ("forward", "backward") else None,
            kind="cuda_api" if cause == "cuda_api" else "cpu_overhead",
            title=f"GPU idle {ms(ns)} ({of_window(analysis, ns / basis.gpu_ns)}): {label}" + own_cost_note(analysis, raw - ns)
                  + (profiler_unmeasured(analysis) if cause == "cuda_api" else ""),
            impact_ns=ns, fix=CAUSE_FIXES[cause],
            threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
            evidence={"cause": cause, "idle_ns": int(raw), "instrumentation_ns": int(raw - ns)},
        ))
    return out


def _cuda_graphs(analysis) -> dict | None:
    """Launches that cannot keep the GPU fed: torch.compile's reduce-overhead mode replays the step's kernels as
    CUDA graphs, one launch for many (the knob compile=reduce-overhead; tune and try measure whether it holds).
    None where the program captures graphs already."""
    return None if (analysis.settings or {}).get("cuda_graphs") else {"compile": "reduce-overhead"}


def _launch_bound(analysis, basis) -> list[Finding]:
    """Idle time too finely chopped for the gap analysis: many gaps shorter than --min-gap-ms."""
    if not analysis.idle or not analysis.window:
        return []
    out = []
    window_ns = basis.window_ns
    loop = _optimizer_loop_idle(analysis, basis)
    for dev in analysis.idle.devices:
        busy = int(round(analysis.window_utilization.get(dev.device_id, 0.0) * window_ns))
        raw, n_short, median = basis.short[dev.device_id]
        if loop and analysis.steps and analysis.steps.pid in (dev.pids or ()):
            raw = max(0, raw - loop)
        raw = max(0, raw - _after_syncs(basis, dev.device_id))
        short_idle = int(raw * basis.keep)
        if short_idle < THRESHOLDS["min_impact_ns"] or short_idle < THRESHOLDS["launch_bound_fraction"] * window_ns:
            continue
        out.append(Finding(
            recommend=_cuda_graphs(analysis),
            kind="cpu_overhead",
            title=f"GPU {dev.device_id} is busy only {pct(busy / window_ns)} of the window; {ms(raw)} "
                  f"({pct(raw / window_ns)}) is lost in {n_short} gaps shorter than {ms(analysis.min_gap_ns)} "
                  f"(median {ms(median)}): kernel launches cannot keep up" + own_cost_note(analysis, raw - short_idle)
                  + profiler_unmeasured(analysis),
            impact_ns=short_idle, fix=CAUSE_FIXES["launch_bound"],
            threshold=f"gaps < {ms(analysis.min_gap_ns)} covering >= {pct(THRESHOLDS['launch_bound_fraction'])} of the window",
            evidence={"device_id": dev.device_id, "busy_ns": busy, "short_gaps": n_short, "short_idle_ns": raw,
                      "instrumentation_ns": raw - short_idle},
        ))
    return out


QUESTION = Question(
    name="cpu_bound", order=114, needs=("window_figures", "instrumentation", "optimizer"),
    thresholds={"launch_bound_fraction": 0.20},  # idle in gaps shorter than --min-gap-ms covering 20 % of the window
    findings=_findings, idle_kinds=("cpu_overhead", "cuda_api"), host_kinds=("cpu_overhead", "cuda_api"),
)
