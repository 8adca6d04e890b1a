"""One report read into the decoded tables the analyses use: what a worker hands back.

Reading a report (the SQLite scans, names and enums decoded) is most of an analysis's cost and
needs nothing from the other reports. With several reports (one per rank) each is read on its own,
possibly in another process or on a Dask worker, into this picklable snapshot; merge.py joins the
snapshots into one Trace and the unchanged pipeline runs on it. A worker returns only these tables,
so its memory is bounded by one report's read, never by the job's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.trace.reader import ENUM_TABLES, PROBED_TABLES, Reader, ReportInfo
from nvtx_trace.analyzer.trace.tables import Trace


@dataclass
class DecodedReport:
    """Everything the analyses read from one export, times still on that export's own clock."""

    path: Path
    info: ReportInfo
    warnings: list[str]
    session: tuple[int, int] | None  # the capture session on the events' clock
    utc_start_ns: int | None  # wall clock at the session's start
    host: str | None  # host identity for comparison (None: unknown or redacted); never printed
    cpu_cores: int | None
    gpu_ops: pd.DataFrame
    ranges: pd.DataFrame
    runtime: pd.DataFrame
    api_names: dict[int, str]
    kernel_times: pd.DataFrame  # name_id, count, time_ns
    long_named: dict | None  # kernels read with their demangled names (Trace.long_named_kernels), or None
    launch_rows: dict[tuple[str, str], dict[str, np.ndarray]]  # (table, column) -> the GPU ops announced
    strings: dict[int, str]  # every kernel-name string id the tables refer to
    enums: dict[str, dict[int, str]]
    columns: dict[str, set[str]]  # table -> its columns, for the tables the analyses probe
    gpu_names: dict[int, str]
    thread_names: dict[int, str]
    process_names: dict[int, str]  # pid -> name
    kernel_name_column: str | None

    @property
    def signature(self) -> tuple:
        """Reports of one capture session (one nsys run) share this: their clocks are the same clock."""
        return (self.utc_start_ns, self.session)

    def pids(self) -> set[int]:
        """Every process the analyzed tables hold rows of (not every process the machine listed)."""
        return self.active_pids() | {int(p) for p in pd.unique(self.runtime["pid"])} \
            | {int(p) for c in self.launch_rows.values() for p in np.unique(c["gpid"] >> 24 & 0xFFFFFF)}

    def active_pids(self) -> set[int]:
        """Processes that ran GPU work or NVTX ranges: the ones whose rows make the analysis."""
        return {int(p) for p in pd.unique(self.gpu_ops["pid"])} | {int(p) for p in pd.unique(self.ranges["pid"])}

    def devices(self) -> set[int]:
        return {int(d) for d in pd.unique(self.gpu_ops["device_id"])}


def snapshot(trace: Trace, reader: Reader) -> DecodedReport:
    """The decoded tables of one report, read by ``analysis.decode_report`` (in a worker, or here)."""
    gpu_ops, ranges, runtime = trace.gpu_ops, trace.ranges, trace._runtime
    launch_rows: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    for (table_key, column, _ids), cols in trace._launch_rows.items():
        launch_rows[(table_key, column)] = dict(cols)
    kernel_times = trace._kernel_times
    long_named = trace._long_named
    ids = set(np.unique(gpu_ops["name_id"]).tolist()) | set(kernel_times["name_id"].tolist())
    if long_named is not None:
        ids |= set(np.unique(long_named["name_id"]).tolist()) | set(np.unique(long_named["long_id"]).tolist())
    for cols in launch_rows.values():
        if "name_id" in cols:
            ids |= set(np.unique(cols["name_id"]).tolist())
    strings = reader.strings(sorted(i for i in ids if i >= 0)) if ids else {}
    return DecodedReport(
        path=reader.info.path, info=reader.info, warnings=list(trace.warnings), session=trace.session,
        utc_start_ns=reader.session_utc_ns(), host=reader.host_identity(), cpu_cores=reader.cpu_cores(),
        gpu_ops=gpu_ops, ranges=ranges, runtime=runtime, api_names=dict(trace.api_names),
        kernel_times=kernel_times, long_named=long_named, launch_rows=launch_rows, strings=strings,
        enums={e: reader.enum(e, {}) for e in ENUM_TABLES if reader.has(e)},
        columns={t: reader.table_columns_present(t) for t in PROBED_TABLES if reader.has(t)},
        gpu_names=trace.gpu_names, thread_names=trace.thread_names, process_names=trace.process_names,
        kernel_name_column=trace.kernel_name_column)
