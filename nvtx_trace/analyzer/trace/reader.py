"""The only code that knows the Nsight Systems SQLite schema and how it differs across versions.

It opens exports read-only, checks they are exports at all, and hands out plain
numpy columns (integer nanoseconds, integer ids), read through export_db.py (the SQLite side: which
tables and columns exist, bulk columns, strings, enums). Branch on tables and columns that exist, never
on version numbers.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from nvtx_trace.analyzer.trace.export_db import ExportDb, as_text
from nvtx_trace.analyzer.trace.opening import open_export
from nvtx_trace.errors import BadReportError

RANGE_EVENT_TYPES = (59, 60, 70, 71)  # push/pop, start/end, and their NVTXT imports
GPU_OP_TABLES = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
}
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
MEMCPY_OPER_ENUM, MEM_KIND_ENUM = "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND"
MEMORY_USAGE, MEMORY_OPER_ENUM = "CUDA_GPU_MEMORY_USAGE_EVENTS", "ENUM_CUDA_DEV_MEM_EVENT_OPER"
FALLBACK_MEMORY_OPERS = {0: "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", 1: "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION"}
ENUM_TABLES = (MEMCPY_OPER_ENUM, MEM_KIND_ENUM)  # the enums whose codes the analyses compare
PROBED_TABLES = (RUNTIME, *GPU_OP_TABLES.values(), NVTX)  # whose columns the analyses ask about
RUNTIME_COLUMNS = {"start_ns": "start", "end_ns": "end", "gtid": "globalTid", "corr": "correlationId",
                   "name_id": "nameId"}

# Used only when an export has no ENUM_* tables (pre-2022 schemas).
FALLBACK_MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
FALLBACK_MEM_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 7: "Unknown"}



@dataclass(frozen=True)
class DeviceSource:
    """How each row of a GPU activity table is put on its GPU: its own ``deviceId`` (NULLs filled by inference), or,
    when the table has no such column, the GPU inferred for it (``inferred_from`` says from what), or nothing
    (``known`` False: the caller must not invent a "GPU -1")."""
    sql: str
    inferred_from: str | None = None
    known: bool = True
    fills_from: str | None = None  # where NULL deviceIds are filled from: such rows read as FILLED + their GPU


FILLED = 1 << 20  # added to a GPU filled in for a NULL deviceId, so the reader counts them with no second scan


@dataclass
class ReportInfo:
    path: Path
    nsys_version: str | None
    schema_version: str | None
    tables: set[str] = field(default_factory=set)
    capture_event_types: set[str] | None = None  # None: the export does not record them (2022.4)
    session: tuple[int, int] | None = None  # ANALYSIS_DETAILS startTime/stopTime (see Trace.session for its base)

    def why_missing(self, capture_type: str, what: str, events: str, how: str) -> str:
        """Why a kind of event is absent: not traced, traced with nothing recorded, or unknown (2022.4)."""
        types = self.capture_event_types
        if types is not None and capture_type not in types:
            return f"{what} was not traced in this report (capture with {how})"
        if types is not None:
            return f"{what} was traced but the report holds no {events}"
        return f"the report holds no {events} (traced without {what}, or nothing ran; capture with {how})"


def open_report(path: Path) -> tuple[sqlite3.Connection, ReportInfo]:
    """Open an export for reading only (checks in nvtx_trace.analyzer.trace.opening) and read its metadata."""
    conn, tables = open_export(path)
    conn.execute("PRAGMA cache_size=-65536")
    info = ReportInfo(path=Path(path), nsys_version=None, schema_version=None, tables=tables)
    _read_metadata(conn, info)
    return conn, info


def _read_metadata(conn: sqlite3.Connection, info: ReportInfo) -> None:
    meta = {}
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in info.tables:
            meta.update({as_text(k): as_text(v) for k, v in conn.execute(f"SELECT name, value FROM {table}")})
    info.nsys_version = meta.get("EXPORT_PRODUCT_VERSION")
    info.schema_version = meta.get("EXPORT_SCHEMA_VERSION")
    if "ANALYSIS_DETAILS" in info.tables:
        try:
            row = conn.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row and all(isinstance(v, int) for v in row) and 0 <= row[0] < row[1]:
            info.session = (int(row[0]), int(row[1]))
    if "META_DATA_CAPTURE" in info.tables:
        info.capture_event_types = {
            v for (v,) in conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'CAPTURE_EVENT_TYPE'")
        }


class Reader(ExportDb):
    """Typed, version-independent access to one export: what nsys's tables mean."""

    def __init__(self, path: Path):
        super().__init__(*open_report(Path(path)))
        self._device_sources: dict[str, DeviceSource] = {}

    # ---- schema probing -----------------------------------------------------
    def has_cuda_api(self) -> bool:
        """Whether CUDA API calls (the runtime table) were recorded: syncs and launches need them."""
        return self.has(RUNTIME)

    @cached_property
    def kernel_name_column(self) -> str | None:
        for col in ("shortName", "demangledName", "name"):
            if self.has(GPU_OP_TABLES["kernel"], col):
                return col
        return None

    @cached_property
    def clock_shift_ns(self) -> int:
        """What every stamp read is moved by: 0, unless the whole capture lies at or before 0 (most of the first
        thousand kernels, and of the NVTX ranges where there are no kernels), when the earliest stamp is moved to
        1 ns. Exports of such a clock were refused as damaged (issue 52); negative stamps stay unusable elsewhere,
        and a lone damaged row never moves the rest."""
        kernel = GPU_OP_TABLES["kernel"]
        probe = kernel if self.has(kernel, "start") else NVTX if self.has(NVTX, "start") else None
        if probe is None:
            return 0
        share = self.conn.execute(f"SELECT AVG(start <= 0) FROM (SELECT start FROM {probe} WHERE start IS NOT NULL "
                                  "LIMIT 1000)").fetchone()[0]
        if share is None or share < 0.5:
            return 0
        lows = [self.conn.execute(f"SELECT MIN(start) FROM {t}").fetchone()[0]
                for t in (*GPU_OP_TABLES.values(), RUNTIME, NVTX) if self.has(t, "start")]
        low = min((v for v in lows if isinstance(v, int)), default=1)
        return 1 - low if low <= 0 else 0

    def clock_shift_text(self) -> str:
        return (f"the export's clock runs at or before 0 (its earliest stamp {1 - self.clock_shift_ns} ns): every time "
                f"was read {self.clock_shift_ns} ns later, so the capture starts at 1 ns; the figures are unchanged, "
                "only the times shown are counted from there")

    def stamp(self, column: str) -> str:
        """A time column as read: moved by ``clock_shift_ns`` (NULL stays NULL)."""
        return f"({column} + {self.clock_shift_ns})" if self.clock_shift_ns else column

    def gpu_columns(self, table_key: str, long_names_of: tuple[int, ...] = ()) -> dict[str, str]:
        """What is read from a GPU activity table: times, device and process for every op, and what the
        launch lookups and the copy analysis need (NULL for a column this export lacks). ``long_names_of``:
        short-name ids whose kernels also bring their demangled name's id (``long_id``, -1 for the others)."""
        table = GPU_OP_TABLES[table_key]
        lacking = [c for c in ("start", "end") if not self.has(table, c)]
        if lacking:  # read as NULL times, its rows were dropped: the GPU's work analyzed as none, nothing said
            raise BadReportError(f"{self.info.path}: {table} has no {' or '.join(lacking)} column, so its "
                                 f"{table_key} rows have no times; export the report again with nsys")
        extra = {}
        if table_key == "kernel" and long_names_of and self.has(table, "shortName") and self.has(table, "demangledName"):
            extra["long_id"] = f"CASE WHEN shortName IN ({','.join(map(str, long_names_of))}) THEN demangledName END"
        if table_key == "kernel" and all(self.has(table, c) for c in ("gridX", "gridY", "gridZ")):
            extra["blocks"] = "gridX * gridY * gridZ"  # thread blocks of the launch (the kernel mix's waves)
        wanted = {"start_ns": self.stamp("start"), "end_ns": self.stamp("end"), "device_id": self.device_source(table_key).sql,
                  "gpid": "globalPid", **{
            "kernel": {"name_id": self.kernel_name_column or "NULL", "corr": "correlationId"},
            "memcpy": {"corr": "correlationId", "bytes": "bytes", "copy_kind": "copyKind", "src_kind": "srcKind",
                       "dst_kind": "dstKind"},
            "memset": {"corr": "correlationId", "bytes": "bytes"}}[table_key]}
        return {k: c if k in ("device_id", "start_ns", "end_ns") or c == "NULL" or self.has(table, c) else "NULL"
                for k, c in wanted.items()} | extra

    def device_source(self, table_key: str) -> DeviceSource:
        """The GPU of each row of a GPU activity table. Without a ``deviceId`` column (or where it is NULL) the GPU is
        inferred, safely only: the one GPU the report lists, else each row's CUDA context (or stream) looked up in
        the context table, which names the device every context was created on."""
        if table_key not in self._device_sources:
            self._device_sources[table_key] = self._device_source(GPU_OP_TABLES[table_key])
        return self._device_sources[table_key]

    def _device_source(self, table: str) -> DeviceSource:
        only = self._only_gpu()
        by_context = None if only is not None else self._device_by_context(table)
        if self.has(table, "deviceId"):
            fallback = str(only) if only is not None else by_context[0] if by_context else None
            if not fallback:
                return DeviceSource("deviceId")
            return DeviceSource(f"COALESCE(deviceId, ({fallback}) + {FILLED})",
                                fills_from=f"the one GPU the report lists (GPU {only})" if only is not None
                                else by_context[1])
        if only is not None:
            return DeviceSource(str(only), f"the one GPU the report lists (GPU {only})")
        if by_context:
            return DeviceSource(*by_context)
        return DeviceSource("NULL", known=False)

    def gpu_count_listed(self) -> int:
        """How many GPUs the report's device tables name (0 when it has none)."""
        return len(self._listed_gpus())

    def _listed_gpus(self) -> set[int]:
        ids = set(self.listed_gpu_ids() or [])
        if self.has("TARGET_INFO_CUDA_DEVICE", "gpuId"):
            ids |= {r[0] for r in self.conn.execute("SELECT DISTINCT gpuId FROM TARGET_INFO_CUDA_DEVICE")
                    if isinstance(r[0], int)}
        return ids

    def _only_gpu(self) -> int | None:
        ids = self._listed_gpus()
        return next(iter(ids)) if len(ids) == 1 else None

    def _device_by_context(self, table: str) -> tuple[str, str] | None:
        """A CASE over (process, context) -- or (process, stream) where the table has no context column -- giving
        the device from TARGET_INFO_CUDA_CONTEXT_INFO; only keys that name one device are used."""
        ctx_table = "TARGET_INFO_CUDA_CONTEXT_INFO"
        if not all(self.has(ctx_table, c) for c in ("processId", "contextId", "deviceId")):
            return None
        contexts = {(p, c): d for p, c, d in self.conn.execute(f"SELECT processId, contextId, deviceId FROM {ctx_table}")
                    if all(isinstance(v, int) for v in (p, c, d))}
        if self.has(table, "contextId"):
            pairs, column, what = contexts, "contextId", f"each row's CUDA context ({ctx_table})"
        elif self.has(table, "streamId") and all(self.has("TARGET_INFO_CUDA_STREAM", c)
                                                   for c in ("processId", "contextId", "streamId")):
            rows = self.conn.execute("SELECT processId, streamId, contextId FROM TARGET_INFO_CUDA_STREAM").fetchall()
            pairs = {(p, s): contexts[(p, c)] for p, s, c in rows if (p, c) in contexts and isinstance(s, int)}
            column, what = "streamId", f"each row's CUDA stream (TARGET_INFO_CUDA_STREAM, {ctx_table})"
        else:
            return None
        if self.has(table, "globalPid"):
            key, cases = f"((globalPid >> 24) & 16777215) * 4294967296 + {column}", {
                (p << 32) + k: d for (p, k), d in pairs.items()}
        else:  # no process to tell contexts of different processes apart: only ids on one device serve
            devices: dict[int, set[int]] = {}
            for (_, k), d in pairs.items():
                devices.setdefault(k, set()).add(d)
            key, cases = column, {k: next(iter(d)) for k, d in devices.items() if len(d) == 1}
        if not cases:
            return None
        return f"CASE {key} " + " ".join(f"WHEN {k} THEN {d}" for k, d in sorted(cases.items())) + " END", what

    def runtime_query(self, name_ids: list[int], min_duration_ns: int,
                      launches: list[tuple[str, str, tuple[int, ...]]]) -> tuple[dict[str, str], str]:
        """The one runtime pass as (columns, source) for ``columns``: calls named by ``name_ids``, calls of at
        least ``min_duration_ns``, and the calls that launched the GPU ops of each (table key, column, ids)."""
        # Rows without a usable time or thread come too, to be counted and left out (Trace._runtime).
        cond = [f"end - start >= {int(min_duration_ns)}", "start IS NULL OR end IS NULL OR end < start"]
        if self.has(RUNTIME, "globalTid"):
            cond.append("globalTid IS NULL")
        if name_ids:
            cond.append(f"nameId IN ({','.join(map(str, name_ids))})")
        for table_key, column, op_ids in launches:
            table_columns = self.gpu_columns(table_key) if self.has(GPU_OP_TABLES[table_key]) else {}
            sql_column = table_columns.get(column, "NULL")
            if "NULL" not in (sql_column, table_columns.get("corr", "NULL")) and self.has(RUNTIME, "correlationId"):
                # The subquery costs one more scan of the GPU table; a temp table of the wanted ids costs more.
                cond.append(f"correlationId IN (SELECT g.correlationId FROM {GPU_OP_TABLES[table_key]} g "
                            f"WHERE g.{sql_column} IN ({','.join(map(str, op_ids))}))")
        columns = {k: (self.stamp(c) if k in ("start_ns", "end_ns") else c) if self.has(RUNTIME, c) else "NULL"
                   for k, c in RUNTIME_COLUMNS.items()}
        return columns, f"{RUNTIME} WHERE {' OR '.join(cond)}"

    def count_ranges_named(self, text: str) -> int:
        """How many NVTX ranges carry exactly this text (doctor's test capture)."""
        if not self.has(NVTX):
            return 0
        return self.conn.execute(f"SELECT count(*) FROM {NVTX} n LEFT JOIN StringIds s ON s.id = n.textId "
                                 "WHERE COALESCE(s.value, n.text) = ?", (text,)).fetchone()[0]

    def first_starts(self) -> list[int]:
        """The first positive start of the NVTX and kernel tables: which clock the events are stamped on."""
        out = []
        for table in (NVTX, GPU_OP_TABLES["kernel"]):
            if self.has(table, "start"):
                row = self.conn.execute(f"SELECT {self.stamp('start')} FROM {table} WHERE {self.stamp('start')} > 0 "
                                        "LIMIT 1").fetchone()
                if row and isinstance(row[0], int):
                    out.append(row[0])
        return out

    def listed_gpu_ids(self) -> list[int] | None:
        """GPU ids the report's own device table lists (None when it has none to check against)."""
        if not self.has("TARGET_INFO_GPU", "id"):
            return None
        return [r[0] for r in self.conn.execute("SELECT DISTINCT id FROM TARGET_INFO_GPU") if isinstance(r[0], int)]

    # ---- events and enum codes -----------------------------------------------
    def memory_usage(self) -> dict | None:
        """nsys's CUDA memory trace (``--cuda-memory-usage=true``): device memory (not pinned host memory) the
        driver handed out and took back, per GPU, and its high-water mark (None without the table). nsys records
        it from the program's start, whatever the capture range."""
        if not (self.has(MEMORY_USAGE, "bytes") and self.has(MEMORY_USAGE, "memoryOperationType")
                and self.has(MEMORY_USAGE, "start")):
            return None
        opers = self.enum(MEMORY_OPER_ENUM, FALLBACK_MEMORY_OPERS)
        sign = {i: (-1 if "DEALLOC" in lab.upper() or "FREE" in lab.upper() else
                    1 if "ALLOC" in lab.upper() else 0) for i, lab in opers.items()}
        device = "deviceId" if self.has(MEMORY_USAGE, "deviceId") else "0"
        kind = self.memory_kind("device") if self.has(MEMORY_USAGE, "memKind") else None
        only_device = f"WHERE memKind = {int(kind)} " if kind is not None else ""  # not pinned host memory
        rows = self.conn.execute(f"SELECT {device}, bytes, memoryOperationType FROM {MEMORY_USAGE} "
                                 f"{only_device}ORDER BY start").fetchall()
        if not rows:
            return None
        peak: dict[int, int] = {}
        now: dict[int, int] = {}
        allocations = frees = 0
        for dev, nbytes, oper in rows:
            s = sign.get(oper, 0)
            allocations, frees = allocations + (s > 0), frees + (s < 0)
            now[dev] = now.get(dev, 0) + s * int(nbytes or 0)
            peak[dev] = max(peak.get(dev, 0), now[dev])
        top = max(peak, key=peak.get)
        return {"peak_bytes": int(peak[top]), "device": int(top) if isinstance(top, int) else None,
                "events": len(rows), "allocations": int(allocations), "frees": int(frees)}

    def nvtx_ranges(self) -> tuple[dict[str, np.ndarray], dict[int, str]] | None:
        """NVTX push/pop and start/end ranges as columns (start_ns, end_ns: -1 when never closed, gtid, key,
        domain; start_ns and gtid -1 where NULL, for the caller to count), and each key's label. Registered
        strings keep their id as key; unregistered texts (in ``text``) get a negative key each."""
        if not self.has("NVTX_EVENTS"):
            return None
        types = ",".join(map(str, RANGE_EVENT_TYPES))
        has_text_id = self.has("NVTX_EVENTS", "textId")
        self.conn.execute("DROP TABLE IF EXISTS temp.nvtx_text")
        self.conn.execute(
            f"CREATE TEMP TABLE nvtx_text AS SELECT DISTINCT text FROM NVTX_EVENTS "
            f"WHERE text IS NOT NULL AND eventType IN ({types})" + (" AND textId IS NULL" if has_text_id else ""))
        self.conn.execute("CREATE INDEX temp.nvtx_text_i ON nvtx_text(text)")
        text_key = "-(SELECT rowid FROM temp.nvtx_text t WHERE t.text = n.text)"
        key = f"COALESCE(n.textId, {text_key}, 0)" if has_text_id else f"COALESCE({text_key}, 0)"
        domain = "n.domainId" if self.has("NVTX_EVENTS", "domainId") else "0"
        cols = self.columns(
            {"start_ns": self.stamp("n.start"), "end_ns": f"COALESCE({self.stamp('n.end')}, -1)", "gtid": "n.globalTid",
             "key": key, "domain": f"COALESCE({domain}, 0)"},
            f"NVTX_EVENTS n WHERE n.eventType IN ({types}) AND ({self.stamp('n.start')} > 0 OR n.start IS NULL)")
        if not len(cols["start_ns"]):
            return None
        keys = np.unique(cols["key"])
        names = self.strings(keys[keys > 0])
        texts = {k: as_text(t) for k, t in self.conn.execute("SELECT -rowid, text FROM temp.nvtx_text")}
        return cols, {int(k): names.get(int(k)) or texts.get(int(k)) or "" for k in keys}

    def nvtx_domain_names(self) -> dict[tuple[int, int], str]:
        """(globalTid, domain id) -> the domain's name, from its registration events (type 75)."""
        if not self.has("NVTX_EVENTS", "domainId"):
            return {}
        rows = self.conn.execute(
            "SELECT globalTid, domainId, COALESCE(text, '') FROM NVTX_EVENTS WHERE eventType = 75").fetchall()
        return {(int(g), int(d or 0)): as_text(t) for g, d, t in rows if isinstance(g, int)}

    def api_name_strings(self) -> dict[int, str]:
        """Every string that can name a CUDA runtime/driver call, by id (StringIds: thousands of rows,
        not a DISTINCT over the runtime table's millions)."""
        return {int(i): as_text(n) for i, n in self.conn.execute("SELECT id, value FROM StringIds WHERE value GLOB 'cu*'")}

    def htod_copy_kind(self) -> int | None:
        """The memcpy table's code for host-to-device copies, when the table can tell copy and source kinds."""
        if not all(self.has("CUPTI_ACTIVITY_KIND_MEMCPY", c) for c in ("copyKind", "srcKind")):
            return None
        return self.enum_id("ENUM_CUDA_MEMCPY_OPER", FALLBACK_MEMCPY_KINDS, "Host-to-Device", "HtoD",
                            "CUDA_MEMCPY_KIND_HTOD")

    def memory_kind(self, kind: str) -> int | None:
        """Code of a memory kind: ``pageable``, ``pinned`` or ``device``."""
        return self.enum_id("ENUM_CUDA_MEM_KIND", FALLBACK_MEM_KINDS, kind.capitalize(),
                            f"CUDA_MEMOPR_MEMORY_KIND_{kind.upper()}")

    # ---- decoded entities -------------------------------------------------
    def gpu_names(self) -> dict[int, str]:
        if self.has("TARGET_INFO_GPU", "name"):
            key = "id" if self.has("TARGET_INFO_GPU", "id") else "deviceId"
            return {i: as_text(n) for i, n in self.conn.execute(f"SELECT {key}, name FROM TARGET_INFO_GPU")
                    if isinstance(i, int) and n is not None}
        if self.has("TARGET_INFO_CUDA_GPU", "name"):
            return {i: as_text(n) for i, n in self.conn.execute("SELECT deviceId, name FROM TARGET_INFO_CUDA_GPU")
                    if isinstance(i, int) and n is not None}
        return {}

    def sm_counts(self) -> dict[int, int]:
        """Streaming multiprocessors per listed GPU ({} where the export does not say)."""
        if self.has("TARGET_INFO_GPU", "smCount"):
            key = "id" if self.has("TARGET_INFO_GPU", "id") else "deviceId"
            return {int(i): int(n) for i, n in self.conn.execute(f"SELECT {key}, smCount FROM TARGET_INFO_GPU")
                    if isinstance(i, int) and isinstance(n, int) and n > 0}
        return {}

    def thread_names(self) -> dict[int, str]:
        if not self.has("ThreadNames"):
            return {}
        rows = [(g, n) for g, n in self.conn.execute("SELECT globalTid, nameId FROM ThreadNames ORDER BY priority")
                if isinstance(g, int) and isinstance(n, int)]
        names = self.strings({n for _, n in rows})
        return {g: names[n] for g, n in rows}

    def cpu_cores(self) -> int | None:
        """Logical CPUs of the profiled machine (TARGET_INFO_SYSTEM_ENV ``CpuCores``), or None."""
        if not self.has("TARGET_INFO_SYSTEM_ENV", "name") or not self.has("TARGET_INFO_SYSTEM_ENV", "value"):
            return None
        row = self.conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CpuCores'").fetchone()
        try:
            return int(row[0]) if row and int(row[0]) > 0 else None
        except (TypeError, ValueError):
            return None

    def process_names(self) -> dict[int, str]:
        if not self.has("PROCESSES"):
            return {}
        return {g: as_text(n) or "" for g, n in self.conn.execute("SELECT globalPid, name FROM PROCESSES")
                if isinstance(g, int)}

    def host_identity(self) -> str | None:
        """Which machine captured the report (host name and system UID), or None where the export does not
        say or they were redacted. Only compared between reports, never written out."""
        if not self.has("TARGET_INFO_SYSTEM_ENV", "name") or not self.has("TARGET_INFO_SYSTEM_ENV", "value"):
            return None
        rows = dict(self.conn.execute(
            "SELECT name, value FROM TARGET_INFO_SYSTEM_ENV WHERE name IN ('Hostname', 'SystemUID')").fetchall())
        known = [str(rows[k]) for k in ("Hostname", "SystemUID")
                 if rows.get(k) not in (None, "") and not str(rows[k]).startswith("[redacted")]
        return "|".join(known) or None

    def session_utc_ns(self) -> int | None:
        """Wall-clock (UTC) time of the session's start, TARGET_INFO_SESSION_START_TIME.utcEpochNs."""
        if not self.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
            return None
        row = self.conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        return int(row[0]) if row and isinstance(row[0], int) else None
