"""The analysis units, in the order they are listed (pipeline.ordered keeps it where needs allow).

Each unit: ``run`` (sets its result on the Analysis, or says in ``skipped`` why not),
``needs``, and the summary.json section and notebook tables it owns. Rules (rules.py)
read the typed results once every unit ran.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from nvtx_trace.analyzer import intervals as iv
from nvtx_trace.analyzer.collectives import alone_warning, analyze_collectives
from nvtx_trace.analyzer.dataloader import analyze_loader
from nvtx_trace.analyzer.gpu_idle import analyze_idle, describe_gaps, summarize_causes
from nvtx_trace.analyzer.infer_steps import infer_from_ranges, infer_steps
from nvtx_trace.analyzer.instrumentation import analyze_instrumentation
from nvtx_trace.analyzer.layout import analyze_layout
from nvtx_trace.analyzer.layout import launch_filter as layout_launches
from nvtx_trace.analyzer.pageable import analyze_pageable
from nvtx_trace.analyzer.pageable import launch_filter as pageable_launches
from nvtx_trace.analyzer.pipeline import Context, Unit
from nvtx_trace.analyzer.ranks import rank_rows
from nvtx_trace.analyzer.rules import build_findings
from nvtx_trace.analyzer.startup import FIRST_TIME_NS, analyze_startup, first_time_code_ns
from nvtx_trace.analyzer.steps import STEP_PARTS, analyze_steps
from nvtx_trace.analyzer.sync import analyze_sync


def why_missing(trace, capture_type: str, what: str, events: str, how: str) -> str:
    types = trace.info.capture_event_types
    if types is not None and capture_type not in types:
        return f"{what} was not traced in this report (capture with {how})"
    if types is not None:
        return f"{what} was traced but the report holds no {events}"
    return f"the report holds no {events} (traced without {what}, or nothing ran; capture with {how})"


# ---------------------------------------------------------------- data loader

def _loader(ctx: Context) -> None:
    ctx.result.loader = analyze_loader(ctx.trace.ranges, ctx.loader_pattern)
    if ctx.result.loader is None:
        ctx.result.skipped["dataloader_stall"] = ("no data-loader ranges (nvtx_autotrace's `dataloader.next [...]`, "
                                                  "or user ranges matching --loader-pattern)")


def _loader_json(a) -> dict:
    if not a.loader:
        return {"dataloader": None}
    return {"dataloader": {"loaders": a.loader.loaders, "workers": a.loader.workers,
                           "worker_restarts": a.loader.restarts}}


def _loader_tables(a) -> dict:
    if not a.loader:
        return {}
    return {"loader_waits": a.loader.waits, "loaders": a.loader.loaders, "loader_workers": a.loader.workers}


# ---------------------------------------------------------------- GPU activity: idle gaps, layout, copies, kernels

def _gpu_missing(ctx: Context) -> str:
    return why_missing(ctx.trace, "Cuda", "CUDA", "GPU activity (kernels, memory copies or memsets with valid times)",
                       "-t cuda on a machine with a GPU")


def _idle(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        ctx.result.idle = analyze_idle(ctx.trace, ctx.min_gap_ns, ctx.loader_pattern)
    else:
        ctx.result.skipped["gpu_idle"] = _gpu_missing(ctx)


def _idle_json(a) -> dict:
    if not a.idle:
        return {"devices": [], "idle_causes": None}
    return {"devices": [{
        "device_id": d.device_id, "name": d.name, "pids": d.pids, "span_start_ns": d.span_start_ns,
        "span_end_ns": d.span_end_ns, "span_ns": d.span_ns, "busy_ns": d.busy_ns, "utilization": d.utilization,
        "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
        "window_utilization": a.window_utilization.get(d.device_id),
    } for d in a.idle.devices], "idle_causes": {"window": a.window_causes, "whole_trace": a.idle.causes}}


def _idle_tables(a) -> dict:
    if not a.idle:
        return {}
    return {"devices": pd.DataFrame([{
        "device_id": d.device_id, "name": d.name, "span_ns": d.span_ns, "busy_ns": d.busy_ns,
        "utilization": d.utilization, "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
    } for d in a.idle.devices]), "gaps": a.idle.gaps, "causes": a.idle.causes}


def _layout(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        ctx.result.layout = analyze_layout(ctx.trace)
    else:
        ctx.result.skipped["layout_transpose"] = _gpu_missing(ctx)


def _layout_json(a) -> dict:
    if not a.layout:
        return {"transposes": None}
    lay = a.layout
    return {"transposes": {"count": lay.count, "time_ns": lay.time_ns, "kernel_time_ns": lay.kernel_time_ns,
                           "kernel_time_fraction": lay.kernel_time_fraction, "kernels": lay.by_kernel,
                           "modules": lay.by_module}}


def _layout_tables(a) -> dict:
    return {"transpose_kernels": a.layout.by_kernel, "transpose_modules": a.layout.by_module} if a.layout else {}


def _pageable(ctx: Context) -> None:
    if not ctx.trace.has_gpu_activity:
        ctx.result.skipped["pageable_h2d"] = _gpu_missing(ctx)
        return
    ctx.result.pageable = analyze_pageable(ctx.trace)
    if ctx.result.pageable is None:
        ctx.result.skipped["pageable_h2d"] = ("no host-to-device copy records with a source memory kind (the memcpy "
                                              "table, or its copyKind/srcKind column, is missing)")


def _pageable_json(a) -> dict:
    p = a.pageable
    if not p:
        return {"pageable_h2d": None}
    return {"pageable_h2d": {"count": p.count, "bytes": p.bytes, "time_ns": p.time_ns, "api_ns": p.api_ns,
                             "bandwidth_gbps": p.bandwidth_gbps, "pinned_count": p.pinned_count,
                             "pinned_bytes": p.pinned_bytes, "pinned_time_ns": p.pinned_time_ns,
                             "pinned_bandwidth_gbps": p.pinned_bandwidth_gbps, "sources": p.by_source}}


def _top_kernels(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        ctx.result.top_kernels = ctx.trace.kernel_time_by_name().head(50)


# ---------------------------------------------------------------- host syncs

def _sync(ctx: Context) -> None:
    a = ctx.result
    a.sync = analyze_sync(ctx.trace) if ctx.reader.has("CUPTI_ACTIVITY_KIND_RUNTIME") else None
    if a.sync is None:
        a.skipped.setdefault("sync", why_missing(ctx.trace, "Cuda", "CUDA", "CUDA API calls", "-t cuda"))
        if a.idle:
            ctx.trace.warnings.append("the report has GPU activity but no CUDA API calls: host syncs, blocking "
                                      "copies and which module launched a kernel cannot be measured")


def _sync_json(a) -> dict:
    if not a.sync:
        return {"sync": None}
    return {"sync": {"count": a.sync.count, "blocked_ns": a.sync.blocked_ns, "sources": a.sync.by_source}}


# ---------------------------------------------------------------- steps and the analysis window

def _steps(ctx: Context) -> None:
    a = ctx.result
    busy_by_pid: dict[int, iv.Set] = {}
    for dev in a.idle.devices if a.idle else []:
        for pid in dev.pids:
            busy_by_pid[pid] = iv.merge(busy_by_pid.get(pid, iv.empty()), dev.busy)
    infer = None if ctx.step_range else (lambda: _infer(ctx.trace))
    a.steps = analyze_steps(ctx.trace.ranges, busy_by_pid if a.idle else None, a.loader.waits if a.loader else None,
                            a.sync.calls if a.sync else None, ctx.warmup_steps, infer=infer,
                            step_range=ctx.step_range)
    if a.steps is not None and ctx.warmup_steps is None:
        t = a.steps.table
        a.steps.extend_warmup(first_time_code_ns(ctx.trace, t["start_ns"].to_numpy(), t["end_ns"].to_numpy()),
                              FIRST_TIME_NS)
    if a.steps is None and ctx.step_range is not None:
        a.skipped["steps"] = f"no NVTX range matches --step-range {ctx.step_range!r}"
    elif a.steps is None:
        a.skipped["steps"] = ("no step ranges (`step N` from nvtx_autotrace, or user ranges like `step 3`), and the "
                              "kernel sequence shows no repeating iteration")


def _steps_json(a) -> dict:
    if not a.steps:
        return {"steps": None}
    table = a.steps.table.astype(object)
    for what in STEP_PARTS:
        if what not in a.steps.measured:  # not captured: unknown, not zero
            table[f"{what}_ns"] = None
        else:  # nanoseconds are whole; NaN (unknown in that step) is null
            table[f"{what}_ns"] = [None if pd.isna(v) else int(v) for v in table[f"{what}_ns"]]
    return {"steps": {"source": a.steps.source, "how": a.steps.how, "confidence": a.steps.confidence,
                      "summary": a.steps.summary(), "table": table}}


def _infer(trace):
    """nvtx_autotrace's optimizer ranges mark iterations exactly; else the kernel sequence's period; else a
    range that recurs evenly on the training thread (a CPU-only report)."""
    by_ranges = infer_from_ranges(trace.ranges)
    if by_ranges is not None and by_ranges.marker.startswith("optimizer.step "):
        return by_ranges
    by_kernels = infer_steps(trace.gpu_ops) if trace.has_gpu_activity else None
    return by_kernels or by_ranges


def _window(ctx: Context) -> None:
    a = ctx.result
    lo, hi = a.trace_start_ns, a.trace_end_ns
    window = a.steps.steady_window() if a.steps else None
    if a.steps and not window:
        a.window = {"start_ns": lo, "end_ns": hi,
                    "source": f"whole trace (all {len(a.steps.table)} steps counted as warm-up)"}
    elif window:
        first, last = int(a.steps.steady["step"].iloc[0]), int(a.steps.steady["step"].iloc[-1])
        inferred = {"inferred:kernel-period": ", inferred from the kernel sequence",
                    "inferred:nvtx-period": ", inferred from a recurring range"}.get(a.steps.source, "")
        n = a.steps.warmup_steps
        after = {0: "no warm-up step left out", 1: "after 1 warm-up step"}.get(n, f"after {n} warm-up steps")
        a.window = {"start_ns": window[0], "end_ns": window[1],
                    "source": f"steady-state steps {first}-{last}, {after}{inferred}"}
    else:
        a.window = {"start_ns": lo, "end_ns": hi, "source": "whole trace (no step ranges)"}


# ---------------------------------------------------------------- the tool's own cost

def _instrumentation(ctx: Context) -> None:
    a, ranges = ctx.result, ctx.trace.ranges
    if not len(ranges):
        return
    steady = len(a.steps.steady) if a.steps else 0
    w0, w1 = a.window["start_ns"], a.window["end_ns"]
    a.instrumentation = analyze_instrumentation(ranges, (w0, w1), a.steps.pid if a.steps else None, steady)
    if not a.instrumentation:
        return
    a.module_ranges_per_step = a.instrumentation.module_ranges_per_step
    if steady:
        ops = ctx.trace.gpu_ops if ctx.trace.has_gpu_activity else None
        n_ops = int(((ops["start_ns"] >= w0) & (ops["start_ns"] < w1)).sum()) if ops is not None else 0
        a.instrumentation.compare_with_capture(float(np.median(a.steps.steady["duration_ns"])),
                                               n_ops / steady + a.instrumentation.ranges_per_step)


def _instrumentation_json(a) -> dict:
    inst = a.instrumentation
    return {"instrumentation": inst.to_dict() if inst else None, "profiler": inst.profiler_dict() if inst else None}


# ---------------------------------------------------------------- the window's figures, then the findings

def _window_figures(ctx: Context) -> None:
    a = ctx.result
    if not a.idle:
        return
    w0, w1 = a.window["start_ns"], a.window["end_ns"]
    for dev in a.idle.devices:
        busy = int(iv.Coverage(dev.busy).measure(w0, w1))
        a.window_utilization[dev.device_id] = busy / (w1 - w0) if w1 > w0 else 0.0
    a.window_causes = summarize_causes(a.idle.gaps, (w0, w1))
    a.gap_activity = describe_gaps(ctx.trace, a.idle, (w0, w1))


def _window_tables(a) -> dict:
    return {"window_causes": a.window_causes, "gap_activity": a.gap_activity} if a.window_causes is not None else {}


def _communication(ctx: Context) -> None:
    a = ctx.result
    if not ctx.trace.has_gpu_activity or not a.window:
        return
    ids = [int(i) for i in pd.unique(ctx.trace.gpu_ops["name_id"]) if i >= 0]
    window = (a.window["start_ns"], a.window["end_ns"])
    a.communication = analyze_collectives(ctx.trace.gpu_ops, ctx.reader.strings(ids), window)
    reports = len(getattr(ctx.trace, "ranks", None) or [None])
    kernels = ctx.trace.gpu_ops[ctx.trace.gpu_ops["kind"] == 0]
    others = a.communication is not None and bool((kernels["device_id"] != a.communication.devices[0].device_id).any())
    warning = alone_warning(a.communication, window, reports=reports, other_kernels=others)
    spinning = a.communication.wait_sets.get(a.steps.pid) if a.communication and a.steps else None
    every_step = False
    if spinning is not None:  # each step's GPU spinning in collectives for a peer: busy, but not work
        t = a.steps.table
        bounds = t["start_ns"].to_numpy(), t["end_ns"].to_numpy()
        lone = a.communication.unpaired_sets.get(a.steps.pid, iv.empty())
        unknown = iv.Coverage(lone).measure(*bounds) > 0  # a collective without a partner: its wait unknown
        t["collective_wait_ns"] = np.where(unknown, np.nan, iv.Coverage(spinning).measure(*bounds))
        a.steps.measured += ("collective_wait",)
        every_step = bool(len(a.steps.steady)) and a.steps.steady["collective_wait_ns"].isna().all()
    unpaired = a.communication.pairing_warning(every_step) if a.communication is not None else None
    ctx.trace.warnings.extend(w for w in (warning, unpaired) if w)


def _communication_json(a) -> dict:
    c = a.communication
    if c is None:
        return {"communication": None}
    return {"communication": {"matched": c.matched, "devices": c.table()}}


def _startup(ctx: Context) -> None:
    a = ctx.result
    if not a.steps or not len(a.steps.table):
        return
    busy = None
    if a.idle:
        sets = [d.busy for d in a.idle.devices if a.steps.pid in d.pids] or [d.busy for d in a.idle.devices]
        busy = functools.reduce(iv.merge, sets)
    a.startup = analyze_startup(ctx.trace, int(a.steps.table["start_ns"].min()), busy,
                                float(np.median(a.steps.table["duration_ns"])))


def _lanes(ctx: Context) -> None:
    """The NVTX ranges and thread labels the HTML timeline draws: kept here so no renderer reads a file."""
    ranges = ctx.trace.ranges
    ctx.result.nvtx_ranges = ranges
    ctx.result.nvtx_threads = {int(g): ctx.trace.thread_label(int(g)) for g in pd.unique(ranges["gtid"])} \
        if len(ranges) else {}


def _findings(ctx: Context) -> None:
    ctx.result.findings = build_findings(ctx.result)


def _ranks(ctx: Context) -> None:
    """Per-rank rows, when the trace was merged from one report per rank (merge.MergedTrace)."""
    sources = getattr(ctx.trace, "ranks", None)
    if sources is None:
        return
    ctx.result.ranks = rank_rows(ctx.result, sources, ctx.step_range)
    ctx.result.clock = ctx.trace.clock.to_json()


def _ranks_json(a) -> dict:
    return {} if a.ranks is None else {"clock": a.clock, "ranks": a.ranks}


UNITS: list[Unit] = [
    Unit("loader", _loader, to_json=_loader_json, tables=_loader_tables),
    Unit("idle", _idle, to_json=_idle_json, tables=_idle_tables),
    Unit("layout", _layout, to_json=_layout_json, tables=_layout_tables, launches=layout_launches),
    Unit("pageable", _pageable, to_json=_pageable_json, launches=pageable_launches,
         tables=lambda a: {"pageable_sources": a.pageable.by_source} if a.pageable else {}),
    Unit("top_kernels", _top_kernels,
         tables=lambda a: {"top_kernels": a.top_kernels} if a.top_kernels is not None else {}),
    Unit("sync", _sync, needs=("idle",), to_json=_sync_json,
         tables=lambda a: {"sync_sources": a.sync.by_source} if a.sync else {}),
    Unit("steps", _steps, needs=("idle", "loader", "sync"), to_json=_steps_json,
         tables=lambda a: {"steps": a.steps.table} if a.steps else {}),
    Unit("window", _window, needs=("steps",), to_json=lambda a: {"window": a.window or None}),
    Unit("instrumentation", _instrumentation, needs=("window", "steps"), to_json=_instrumentation_json),
    Unit("window_figures", _window_figures, needs=("idle", "window"), tables=_window_tables),
    Unit("communication", _communication, needs=("window",), to_json=_communication_json,
         tables=lambda a: {"communication": a.communication.table()} if a.communication else {}),
    Unit("startup", _startup, needs=("steps", "idle"),
         to_json=lambda a: {"startup": a.startup.to_dict() if a.startup else None}),
    Unit("lanes", _lanes),
    Unit("findings", _findings, needs=("loader", "idle", "layout", "pageable", "sync", "steps", "window",
                                       "instrumentation", "window_figures", "communication"),
         to_json=lambda a: {"findings": [f.to_dict() for f in a.findings]}),
    Unit("ranks", _ranks, needs=("findings", "lanes"), to_json=_ranks_json,
         tables=lambda a: {"ranks": pd.DataFrame(a.ranks)} if a.ranks else {}),
]
