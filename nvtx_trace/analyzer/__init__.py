"""Analyze one Nsight Systems export: the entry point of the library and of notebooks.

    from nvtx_trace.analyzer import analyze
    result = analyze("report.sqlite", min_gap_ms=1)
    result.findings                     # ranked, biggest measured cost first
    result.tables["gaps"]               # the DataFrames behind every number

Runs every analysis the report's data allows; ``result.skipped`` says which
were not run and why (no CUDA trace, no NVTX, ...).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analysis_options import check_analysis_options
from nvtx_trace.analyzer import intervals as iv
from nvtx_trace.analyzer.dataloader import LoaderResult, analyze_loader
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.gpu_idle import IdleResult, analyze_idle, describe_gaps, summarize_causes
from nvtx_trace.analyzer.instrumentation import Instrumentation, analyze_instrumentation
from nvtx_trace.analyzer.layout import LayoutResult, analyze_layout
from nvtx_trace.analyzer.layout import launch_filter as layout_launches
from nvtx_trace.analyzer.model import Trace
from nvtx_trace.analyzer.pageable import PageableResult, analyze_pageable
from nvtx_trace.analyzer.pageable import launch_filter as pageable_launches
from nvtx_trace.analyzer.reader import Reader
from nvtx_trace.analyzer.rules import build_findings
from nvtx_trace.analyzer.steps import StepsResult, analyze_steps
from nvtx_trace.analyzer.sync import SyncResult, analyze_sync
from nvtx_trace.errors import BadReportError

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """Everything one report says; renderers (text, JSON, HTML) read only this."""

    path: Path
    nsys_version: str | None
    schema_version: str | None
    min_gap_ns: int
    trace_start_ns: int
    trace_end_ns: int
    idle: IdleResult | None = None
    steps: StepsResult | None = None
    loader: LoaderResult | None = None
    layout: LayoutResult | None = None
    pageable: PageableResult | None = None
    sync: SyncResult | None = None
    window: dict = field(default_factory=dict)  # where the gap causes were measured
    window_causes: pd.DataFrame | None = None
    gap_activity: pd.DataFrame | None = None  # largest gaps of the window: what each CPU thread was doing
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)
    top_kernels: pd.DataFrame | None = None
    window_utilization: dict[int, float] = field(default_factory=dict)  # device -> busy share of the window
    module_ranges_per_step: float = 0.0  # nvtx_autotrace module ranges per steady step (their CPU cost shows)
    instrumentation: Instrumentation | None = None  # nvtx_autotrace's own ranges and their measured cost

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every DataFrame behind the findings, by name (for notebooks)."""
        out: dict[str, pd.DataFrame] = {}
        if self.idle:
            out["devices"] = pd.DataFrame([{
                "device_id": d.device_id, "name": d.name, "span_ns": d.span_ns, "busy_ns": d.busy_ns,
                "utilization": d.utilization, "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
            } for d in self.idle.devices])
            out["gaps"] = self.idle.gaps
            out["causes"] = self.idle.causes
        if self.window_causes is not None:
            out["window_causes"] = self.window_causes
            out["gap_activity"] = self.gap_activity
        if self.steps:
            out["steps"] = self.steps.table
        if self.loader:
            out["loader_waits"] = self.loader.waits
            out["loaders"] = self.loader.loaders
            out["loader_workers"] = self.loader.workers
        if self.layout:
            out["transpose_kernels"] = self.layout.by_kernel
            out["transpose_modules"] = self.layout.by_module
        if self.pageable:
            out["pageable_sources"] = self.pageable.by_source
        if self.sync:
            out["sync_sources"] = self.sync.by_source
        if self.top_kernels is not None:
            out["top_kernels"] = self.top_kernels
        return out


def analyze(path, min_gap_ms: float = 1.0, loader_pattern: str | None = None,
            warmup_steps: int | None = None, nsys: str | None = None) -> Analysis:
    """Load a report (.sqlite, or .nsys-rep/.qdrep exported on the fly) and run every analysis it allows."""
    check_analysis_options(min_gap_ms, loader_pattern, warmup_steps)
    path = Path(path)
    if path.suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
        from nvtx_trace.nsys import ensure_sqlite, find_nsys

        path = ensure_sqlite(path, nsys=find_nsys(nsys) if nsys else None)
    try:
        reader = Reader(path)
        try:
            return _analyze(reader, int(round(min_gap_ms * 1e6)),
                            loader_pattern or names.DEFAULT_USER_LOADER_PATTERN, warmup_steps)
        finally:
            reader.close()
    except sqlite3.DatabaseError as exc:
        raise BadReportError(f"{path}: cannot be read as an Nsight Systems export ({exc}); "
                             "if it was cut short, export it again") from None


def _analyze(reader: Reader, min_gap_ns: int, loader_pattern: str, warmup_steps: int | None) -> Analysis:
    trace = Trace(reader)
    announce_launches(trace)
    trace.start_runtime_read()  # runs while this thread reads the GPU tables
    try:
        return _run_analyses(trace, reader, min_gap_ns, loader_pattern, warmup_steps)
    finally:
        trace.close()


def _run_analyses(trace: Trace, reader: Reader, min_gap_ns: int, loader_pattern: str,
                  warmup_steps: int | None) -> Analysis:
    lo, hi = trace.bounds
    result = Analysis(path=reader.info.path, nsys_version=reader.info.nsys_version,
                      schema_version=reader.info.schema_version, min_gap_ns=min_gap_ns,
                      trace_start_ns=lo, trace_end_ns=hi, thread_names=trace.thread_names)
    ranges = trace.ranges
    if not len(ranges) and not trace.has_gpu_activity:
        raise BadReportError(f"{reader.info.path}: holds no GPU activity and no NVTX ranges, so there is nothing to "
                             "analyze" + "".join(f" ({w})" for w in trace.warnings)
                             + "; capture with: nsys profile -t cuda,nvtx (nvtx-trace run does this)")
    if not len(ranges):
        result.skipped["nvtx"] = _why_missing(trace, "NvtxEvents", "NVTX", "NVTX ranges",
                                              "-t nvtx and run under nvtx_autotrace")
    result.loader = analyze_loader(ranges, loader_pattern)
    if trace.has_gpu_activity:
        result.idle = analyze_idle(trace, min_gap_ns, loader_pattern)
        result.layout = analyze_layout(trace)
        result.pageable = analyze_pageable(trace)
        if result.pageable is None:
            result.skipped["pageable_h2d"] = ("no host-to-device copy records with a source memory kind (the memcpy "
                                              "table, or its copyKind/srcKind column, is missing)")
        result.top_kernels = trace.kernel_time_by_name().head(50)
    else:
        why = _why_missing(trace, "Cuda", "CUDA", "GPU activity (kernels, memory copies or memsets with valid times)",
                           "-t cuda on a machine with a GPU")
        for name in ("gpu_idle", "layout_transpose", "pageable_h2d"):
            result.skipped[name] = why
    result.sync = analyze_sync(trace) if reader.has("CUPTI_ACTIVITY_KIND_RUNTIME") else None
    if result.sync is None:
        result.skipped.setdefault("sync", _why_missing(trace, "Cuda", "CUDA", "CUDA API calls", "-t cuda"))
        if result.idle:
            trace.warnings.append("the report has GPU activity but no CUDA API calls: host syncs, blocking copies "
                                  "and which module launched a kernel cannot be measured")
    busy_by_pid: dict[int, iv.Set] = {}
    for dev in result.idle.devices if result.idle else []:
        for pid in dev.pids:
            busy_by_pid[pid] = iv.merge(busy_by_pid.get(pid, iv.empty()), dev.busy)
    result.steps = analyze_steps(ranges, busy_by_pid if result.idle else None,
                                 result.loader.waits if result.loader else None,
                                 result.sync.calls if result.sync else None, warmup_steps)
    if result.steps is None:
        result.skipped["steps"] = "no step ranges (`step N` from nvtx_autotrace, or user ranges like `step 3`)"
    if result.loader is None:
        result.skipped["dataloader_stall"] = ("no data-loader ranges (nvtx_autotrace's `dataloader.next [...]`, "
                                              "or user ranges matching --loader-pattern)")
    window = result.steps.steady_window() if result.steps else None
    if result.steps and not window:
        result.window = {"start_ns": lo, "end_ns": hi,
                         "source": f"whole trace (all {len(result.steps.table)} steps counted as warm-up)"}
    elif window:
        s = result.steps
        first, last = int(s.steady["step"].iloc[0]), int(s.steady["step"].iloc[-1])
        result.window = {"start_ns": window[0], "end_ns": window[1],
                         "source": f"steady-state steps {first}-{last} ({s.warmup_steps} warm-up step(s) left out)"}
    else:
        result.window = {"start_ns": lo, "end_ns": hi, "source": "whole trace (no step ranges)"}
    if len(ranges):
        steady = len(result.steps.steady) if result.steps else 0
        result.instrumentation = analyze_instrumentation(
            ranges, (result.window["start_ns"], result.window["end_ns"]), result.steps.pid if result.steps else None,
            steady)
        if result.instrumentation:
            result.module_ranges_per_step = result.instrumentation.module_ranges_per_step
            if steady:
                w0, w1 = result.window["start_ns"], result.window["end_ns"]
                ops = trace.gpu_ops if trace.has_gpu_activity else None
                n_ops = int(((ops["start_ns"] >= w0) & (ops["start_ns"] < w1)).sum()) if ops is not None else 0
                result.instrumentation.compare_with_capture(
                    float(np.median(result.steps.steady["duration_ns"])),
                    n_ops / steady + result.instrumentation.ranges_per_step)
    if result.idle:
        w0, w1 = result.window["start_ns"], result.window["end_ns"]
        for dev in result.idle.devices:
            busy = int(iv.Coverage(dev.busy).measure(w0, w1))
            result.window_utilization[dev.device_id] = busy / (w1 - w0) if w1 > w0 else 0.0
        result.window_causes = summarize_causes(result.idle.gaps, (w0, w1))
        result.gap_activity = describe_gaps(trace, result.idle, (w0, w1))
    result.findings = build_findings(result)
    result.warnings = trace.warnings
    return result


def announce_launches(trace: Trace) -> None:
    """The GPU ops whose launching CPU calls the analyses need (layout transposes, host-to-device copies):
    announced before anything is read, so one runtime pass serves every analysis."""
    for request in (layout_launches(trace), pageable_launches(trace)):
        if request is not None:
            trace.want_launches(*request)


def _why_missing(trace: Trace, capture_type: str, what: str, events: str, how: str) -> str:
    types = trace.info.capture_event_types
    if types is not None and capture_type not in types:
        return f"{what} was not traced in this report (capture with {how})"
    if types is not None:
        return f"{what} was traced but the report holds no {events}"
    return f"the report holds no {events} (traced without {what}, or nothing ran; capture with {how})"
