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

import pandas as pd

from nvtx_trace import names
from nvtx_trace.analysis_options import check_analysis_options
from nvtx_trace.analyzer import pipeline
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.model import Trace
from nvtx_trace.analyzer.question import Context
from nvtx_trace.analyzer.questions import REGISTRY
from nvtx_trace.analyzer.reader import Reader
from nvtx_trace.errors import BadReportError

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """Everything one report says; renderers (text, JSON, HTML) read only this.

    Each registered question sets its result as ``analysis.<question name>`` (and the other attributes its
    ``results`` declare); the fields below are the report's own.
    """

    path: Path
    nsys_version: str | None
    schema_version: str | None
    min_gap_ns: int
    trace_start_ns: int
    trace_end_ns: int
    findings: list[Finding] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    thread_names: dict[int, str] = field(default_factory=dict)
    cpu_cores: int | None = None  # of the profiled machine, as the report says: advice never exceeds it
    pid_hosts: dict[int, str] = field(default_factory=dict)  # several reports merged: each pid's named host

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every DataFrame behind the findings, by name (for notebooks); each question names its own."""
        out: dict[str, pd.DataFrame] = {}
        for q in REGISTRY:
            if q.tables is not None:
                out.update(q.tables(self))
        return out


def analyze(path, min_gap_ms: float = 1.0, loader_pattern: str | None = None,
            warmup_steps: int | None = None, nsys: str | None = None, step_range: str | None = None,
            scheduler: str | None = None, workers: int | None = None) -> Analysis:
    """Load a report (.sqlite, or .nsys-rep/.qdrep exported on the fly) and run every analysis it allows.

    ``path`` may also name several reports (a list, a folder, a glob): one per rank, merged into one
    analysis; they are read in parallel (``workers`` processes, or the Dask ``scheduler`` named).
    """
    check_analysis_options(min_gap_ms, loader_pattern, warmup_steps, step_range)
    from nvtx_trace.analyzer.inputs import expand
    from nvtx_trace.analyzer.parallel import check_scheduler

    check_scheduler(scheduler, workers)
    paths = [_as_sqlite(p, nsys) for p in expand(path)]
    if len(paths) > 1:
        return _analyze_ranks(paths, int(round(min_gap_ms * 1e6)), loader_pattern or names.DEFAULT_USER_LOADER_PATTERN,
                              warmup_steps, step_range, scheduler, workers)
    path = paths[0]
    try:
        reader = Reader(path)
        try:
            return _analyze(reader, int(round(min_gap_ms * 1e6)),
                            loader_pattern or names.DEFAULT_USER_LOADER_PATTERN, warmup_steps, step_range)
        finally:
            reader.close()
    except sqlite3.DatabaseError as exc:
        raise BadReportError(f"{path}: cannot be read as an Nsight Systems export ({exc}); "
                             "if it was cut short, export it again") from None


def _as_sqlite(path, nsys: str | None) -> Path:
    path = Path(path)
    if path.suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
        from nvtx_trace.capture.export import ensure_sqlite
        from nvtx_trace.capture.locate import find_nsys

        path = ensure_sqlite(path, nsys=find_nsys(nsys) if nsys else None)
    return path


def _analyze_ranks(paths: list[Path], min_gap_ns: int, loader_pattern: str, warmup_steps: int | None,
                   step_range: str | None, scheduler: str | None, workers: int | None) -> Analysis:
    """One report per rank: each read on its own (in parallel), checked, put on one clock, merged into
    one trace, then the same units as for one report."""
    from nvtx_trace.analyzer import clocks, merge, parallel, ranks

    reports = parallel.read_reports(paths, scheduler, workers)
    ranks.check_reports(reports)
    plan = clocks.align(reports)
    trace = merge.merge(reports, plan)
    if plan.needs_warning:
        trace.warnings.append(f"clocks: {plan.how()}")
    pipeline.announce(REGISTRY, trace)
    return _run_analyses(trace, trace.reader, min_gap_ns, loader_pattern, warmup_steps, step_range)


def _analyze(reader: Reader, min_gap_ns: int, loader_pattern: str, warmup_steps: int | None,
             step_range: str | None = None) -> Analysis:
    trace = Trace(reader)
    pipeline.announce(REGISTRY, trace)  # what the units will ask of the runtime table, before anything is read
    trace.start_runtime_read()  # runs while this thread reads the GPU tables
    try:
        return _run_analyses(trace, reader, min_gap_ns, loader_pattern, warmup_steps, step_range)
    finally:
        trace.close()


def _run_analyses(trace: Trace, reader: Reader, min_gap_ns: int, loader_pattern: str,
                  warmup_steps: int | None, step_range: str | None = None) -> Analysis:
    lo, hi = trace.bounds
    result = Analysis(path=reader.info.path, nsys_version=reader.info.nsys_version,
                      schema_version=reader.info.schema_version, min_gap_ns=min_gap_ns,
                      trace_start_ns=lo, trace_end_ns=hi, thread_names=trace.thread_names,
                      cpu_cores=reader.cpu_cores(), pid_hosts=getattr(trace, "pid_hosts", {}))
    if not len(trace.ranges) and not trace.has_gpu_activity:
        raise BadReportError(f"{reader.info.path}: holds no GPU activity and no NVTX ranges, so there is nothing to "
                             "analyze" + "".join(f" ({w})" for w in trace.warnings)
                             + "; capture with: nsys profile -t cuda,nvtx (nvtx-trace run does this)")
    if not len(trace.ranges):
        result.skipped["nvtx"] = trace.info.why_missing("NvtxEvents", "NVTX", "NVTX ranges",
                                                        "-t nvtx and run under nvtx_autotrace")
    pipeline.run(REGISTRY, Context(trace=trace, reader=reader, result=result, min_gap_ns=min_gap_ns,
                                         loader_pattern=loader_pattern, warmup_steps=warmup_steps,
                                         step_range=step_range))
    result.warnings = trace.warnings
    return result
