"""``analyze``: every registered question the report's data allows; ``result.skipped`` says which were not
run and why (no CUDA trace, no NVTX, ...)."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from nvtx_trace.analyzer import pipeline
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.options import AnalysisOptions, parse_options
from nvtx_trace.analyzer.question import Context
from nvtx_trace.analyzer.questions import REGISTRY
from nvtx_trace.analyzer.trace.decoded import DecodedReport, snapshot
from nvtx_trace.analyzer.trace.reader import Reader
from nvtx_trace.analyzer.trace.tables import Trace
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
    cpu_cores: int | None = None  # the CPUs the program may use (settings record), else the machine's: advice never exceeds it
    cpus_host: int | None = None  # the machine's, where the settings record says the program may use fewer
    pid_hosts: dict[int, str] = field(default_factory=dict)  # several reports merged: each pid's named host
    raised_by: dict[str, str] = field(default_factory=dict)  # finding kind -> the question that raised it

    def __post_init__(self):
        for q in REGISTRY:  # every result a renderer may read exists, set or not
            for attr, unset in ((q.name, None), *q.results.items()):
                if not hasattr(self, attr):
                    setattr(self, attr, unset.copy() if isinstance(unset, dict) else unset)

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every DataFrame behind the findings, by name (for notebooks); each question names its own."""
        out: dict[str, pd.DataFrame] = {}
        for q in REGISTRY:
            if q.tables is not None:
                out.update(q.tables(self))
        return out


def analyze(path, min_gap_ms: float = 1.0, loader_pattern: str | None = None,
            warmup_steps: int | None = None, step_range: str | None = None,
            scheduler: str | None = None, workers: int | None = None,
            options: AnalysisOptions | None = None) -> Analysis:
    """Load an export (.sqlite) and run every question it allows. ``options`` (analyzer.options.parse_options)
    replaces the keyword options, already checked.

    ``path`` may also name several reports (a list, a folder, a glob): one per rank, merged into one
    analysis; they are read in parallel (``workers`` processes, or the Dask ``scheduler`` named).
    A ``.nsys-rep`` is exported first by the caller (nvtx_trace.capture.export.ensure_sqlite; the CLI does it).
    """
    from nvtx_trace.analyzer.ranks.inputs import expand

    if options is None:
        options = parse_options(min_gap_ms, loader_pattern, warmup_steps, step_range, scheduler, workers)
    paths = [_sqlite(p) for p in expand(path)]
    if len(paths) > 1:
        return _analyze_ranks(paths, options)
    path = paths[0]
    try:
        reader = Reader(path)
        try:
            return _analyze(reader, options)
        finally:
            reader.close()
    except sqlite3.DatabaseError as exc:
        raise BadReportError(f"{path}: cannot be read as an Nsight Systems export ({exc}); "
                             "if it was cut short, export it again") from None


def _sqlite(path) -> Path:
    path = Path(path)
    if path.suffix in (".nsys-rep", ".qdrep", ".qdstrm"):
        raise BadReportError(f"{path}: export it to SQLite first (nvtx-trace analyze {path.name} does, or "
                             "nvtx_trace.capture.export.ensure_sqlite, or nsys export --type sqlite)")
    return path


def _analyze_ranks(paths: list[Path], options: AnalysisOptions) -> Analysis:
    """One report per rank: each read on its own (in parallel), checked, put on one clock, merged into
    one trace, then the same units as for one report."""
    from nvtx_trace.analyzer.ranks import checks, clocks, merge, parallel

    reports = parallel.read_reports(paths, decode_report, options.scheduler, options.workers)
    checks.check_reports(reports)
    plan = clocks.align(reports)
    trace = merge.merge(reports, plan)
    if plan.needs_warning:
        trace.warnings.append(f"clocks: {plan.how()}")
    pipeline.announce(REGISTRY, trace)
    return _run_analyses(trace, trace.reader, options)


def decode_report(path) -> DecodedReport:
    """One rank's report read the way analyze() would read it, its decoded tables kept (runs in a worker)."""
    path = Path(path)
    try:
        reader = Reader(path)
        try:
            with _opened(reader) as trace:
                return snapshot(trace, reader)
        finally:
            reader.close()
    except sqlite3.DatabaseError as exc:
        raise BadReportError(f"{path}: cannot be read as an Nsight Systems export ({exc}); "
                             "if it was cut short, export it again") from None


@contextlib.contextmanager
def _opened(reader: Reader):
    """The report's Trace, its runtime table read in the background: one way to open a report for analyze() and
    for a rank's worker alike."""
    trace = Trace(reader)
    pipeline.announce(REGISTRY, trace)  # what the units will ask of the runtime table, before anything is read
    trace.start_runtime_read()  # runs while this thread reads the GPU tables
    try:
        yield trace
    finally:
        trace.close()


def _analyze(reader: Reader, options: AnalysisOptions) -> Analysis:
    with _opened(reader) as trace:
        return _run_analyses(trace, reader, options)


def _run_analyses(trace: Trace, reader: Reader, options: AnalysisOptions) -> Analysis:
    lo, hi = trace.bounds
    result = Analysis(path=reader.info.path, nsys_version=reader.info.nsys_version,
                      schema_version=reader.info.schema_version, min_gap_ns=options.min_gap_ns,
                      trace_start_ns=lo, trace_end_ns=hi, thread_names=trace.thread_names,
                      cpu_cores=reader.cpu_cores(), pid_hosts=getattr(trace, "pid_hosts", {}))
    unusable = [w for w in trace.warnings if "without a valid start/end" in w]
    if not len(trace.ranges) and not trace.has_gpu_activity and unusable:
        raise BadReportError(f"{reader.info.path}: no GPU row has a usable time ({'; '.join(unusable)}) and no NVTX "
                             "range starts after 0: its timestamps look shifted or damaged; export the report again "
                             "from its .nsys-rep (nsys export --type sqlite)")
    if not len(trace.ranges) and not trace.has_gpu_activity:
        raise BadReportError(f"{reader.info.path}: holds no GPU activity and no NVTX ranges, so there is nothing to "
                             "analyze" + "".join(f" ({w})" for w in trace.warnings)
                             + "; capture with: nsys profile -t cuda,nvtx (nvtx-trace run does this)")
    if not len(trace.ranges):
        result.skipped["nvtx"] = trace.info.why_missing("NvtxEvents", "NVTX", "NVTX ranges",
                                                        "-t nvtx and run under nvtx_autotrace")
    pipeline.run(REGISTRY, Context(trace=trace, reader=reader, result=result, min_gap_ns=options.min_gap_ns,
                                   loader_pattern=options.loader_pattern, warmup_steps=options.warmup_steps,
                                   step_range=options.step_range))
    result.warnings = trace.warnings
    return result
