"""Decoded tables the analyses share: integer ``*_ns`` columns, names resolved, pids split out.

Each table is loaded once, lazily, with only the columns the analyses need.
Names stay as pandas categoricals so millions of rows cost one int each.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future
from functools import cached_property
from typing import Callable

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.trace import validity
from nvtx_trace.analyzer.trace.reader import FILLED, GPU_OP_TABLES, RUNTIME, RUNTIME_COLUMNS, Reader

GPU_OP_KINDS = list(GPU_OP_TABLES)  # code = index: 0 kernel, 1 memcpy, 2 memset

# CUDA runtime/driver calls that block the calling CPU thread until the GPU catches up.
SYNC_API_RE = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize"
    r"|cuCtxSynchronize|cuStreamSynchronize|cuEventSynchronize|cudaMemcpy(?!.*Async)|cudaMemcpy2D(?!.*Async)"
    r"|cuMemcpyDtoH(?!.*Async)|cuMemcpyHtoD(?!.*Async)|cudaMemset(?!.*Async)|cudaFree(?!Host|Async))(_v\d+)?$"
)
COPY_API_RE = re.compile(r"^(cudaMemcpy|cuMemcpy)")
SLOW_API_NS = 50_000  # CUDA calls at least this long are worth naming (cudaMalloc, module loads)
PRELOAD_FILTERS = (SYNC_API_RE, COPY_API_RE)  # the runtime calls the analyses ask for by name


def pid_of(gtid: np.ndarray) -> np.ndarray:
    """OS pid from a global thread or process id (bits 24-47)."""
    return (np.asarray(gtid, dtype=np.int64) >> 24) & 0xFFFFFF


def tid_of(gtid: np.ndarray) -> np.ndarray:
    return np.asarray(gtid, dtype=np.int64) & 0xFFFFFF


def name_mask(range_names: pd.Series, pred) -> np.ndarray:
    """Which rows of a categorical name column satisfy ``pred``: evaluated once per distinct name, not per row."""
    cats = range_names.cat.categories
    if not len(cats):
        return np.zeros(len(range_names), dtype=bool)
    hit = np.array([bool(pred(c)) for c in cats] + [False], dtype=bool)  # code -1 (missing) indexes the False
    return hit[range_names.cat.codes.to_numpy()]


def api_base_name(name: str) -> str:
    """``cudaStreamSynchronize_v3020`` -> ``cudaStreamSynchronize``."""
    return re.sub(r"_v\d+$", "", name)


class Trace:
    """Lazily decoded view of one export."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self.info = reader.info
        self.warnings: list[str] = [reader.clock_shift_text()] if reader.clock_shift_ns else []
        self._launch_requests: list[tuple[str, str, tuple]] = []  # read with the runtime pass
        self._long_names_of: tuple[int, ...] = ()  # short-name ids whose kernels bring their demangled name
        self._long_named: dict[str, np.ndarray] | None = None  # those kernels, as read with the kernel table
        self._row_filters: list[tuple[str, str, Callable]] = []  # (table, name, keep): a question's rows of a pass
        self._kept_rows: dict[str, dict[str, np.ndarray]] = {}  # name -> the rows its filter kept
        self._runtime_read: Future | None = None
        self._launch_rows: dict[tuple, dict[str, np.ndarray]] = {}  # filled while the GPU tables are read
        self._kernel_times = _time_by_id(np.empty(0, np.int64), np.empty(0, np.int64))  # no kernel table: none
        self._runtime_reader: Reader | None = None  # the second connection, while its scan runs
        self._one_device: int | None = None  # set when some GPU table cannot say which GPU ran its rows
        odd = reader.odd_strings()
        if odd:
            said = {"null": "NULL (read as <string ID>)", "blob": "binary (decoded as UTF-8, bad bytes replaced)"}
            self.warnings.append("names in the string table that are not text: "
                                 + ", ".join(f"{n} {said[k]}" for k, n in sorted(odd.items())))

    # ---- time and entities ---------------------------------------------------
    def in_session(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        return validity.plausible(start, end, self.session)

    @cached_property
    def session(self) -> tuple[int, int] | None:
        return validity.session_on_event_clock(self.reader)

    @cached_property
    def bounds(self) -> tuple[int, int]:
        """First and last timestamp of the data analyzed (GPU ops and NVTX ranges), from what is loaded
        anyway: a separate min/max query would scan every table once more."""
        parts = [(int(df["start_ns"].min()), int(df["end_ns"].max()))
                 for df in ((self.gpu_ops if self.has_gpu_activity else None), self.ranges)
                 if df is not None and len(df)]
        return (min(p[0] for p in parts), max(p[1] for p in parts)) if parts else (0, 0)

    @cached_property
    def gpu_names(self) -> dict[int, str]:
        return self.reader.gpu_names()

    @cached_property
    def thread_names(self) -> dict[int, str]:
        return self.reader.thread_names()

    @cached_property
    def process_names(self) -> dict[int, str]:
        return {int(pid_of(g)): n for g, n in self.reader.process_names().items()}

    def thread_label(self, gtid: int) -> str:
        name = self.thread_names.get(int(gtid))
        pid, tid = int(pid_of(gtid)), int(tid_of(gtid))
        proc = self.process_names.get(pid, "").rsplit("/", 1)[-1]
        who = f"{proc}[{pid}]" if proc else f"pid {pid}"
        return f"{who} tid {tid}" + (f" ({name})" if name and name != proc else "")

    # ---- GPU activity ------------------------------------------------------------
    @cached_property
    def has_gpu_activity(self) -> bool:
        return len(self.gpu_ops) > 0

    @cached_property
    def listed_devices(self) -> np.ndarray | None:
        return validity.listed_devices(self.reader)

    def _on_listed_devices(self, key: str, cols: dict) -> dict:
        ok = validity.on_listed_devices(cols["device_id"], self.listed_devices)
        if ok is None:
            return cols
        unknown = sorted({int(d) for d in cols["device_id"][~ok]})[:5]
        self.warnings.append(f"{int((~ok).sum())} {key} row(s) on a device the report does not list "
                             f"(deviceId {', '.join(map(str, unknown))}) were left out")
        return {k: v[ok] for k, v in cols.items()}

    def _read_gpu_table(self, key: str) -> dict[str, np.ndarray]:
        """One scan of a GPU activity table (the kernel table is the largest of long runs).

        Returns the columns gpu_ops keeps; on the way it sums kernel time per name and keeps the
        rows of announced launch requests, so the name and correlation columns are never held whole.
        Rows without a valid time span are dropped and counted.
        """
        cols = self.reader.table_columns(self.reader.gpu_columns(key, self._long_names_of), GPU_OP_TABLES[key])
        source = self.reader.device_source(key)
        if source.inferred_from:
            self.warnings.append(f"the {key} table has no deviceId column: each row's GPU was taken from "
                                 f"{source.inferred_from}")
        if source.fills_from and len(cols["device_id"]) and cols["device_id"].dtype.kind in "iuf":
            filled = cols["device_id"] >= FILLED
            if filled.any():
                cols["device_id"] = np.where(filled, cols["device_id"] - FILLED, cols["device_id"])
                self.warnings.append(f"{int(filled.sum())} {key} row(s) had no deviceId: each one's GPU was taken "
                                     f"from {source.fills_from}")
        if self._one_device is not None:
            cols["device_id"] = np.full(len(cols["start_ns"]), self._one_device, np.int64)
        valid = self.in_session(cols["start_ns"], cols["end_ns"])
        if not valid.all():
            self.warnings.append(f"{int((~valid).sum())} {key} row(s) without a valid start/end (at or before 0, "
                                 "ending before they start, or outside the capture session) were left out")
            cols = {k: v[valid] for k, v in cols.items()}
        if self._one_device is None:
            cols = self._on_listed_devices(key, cols)
        for request in self._launch_requests:
            if request[0] == key:
                keep = np.isin(cols[request[1]], request[2])
                self._launch_rows[request] = {c: v[keep] for c, v in cols.items()}
        if key == "kernel" and self.kernel_name_column:
            self._kernel_times = _time_by_id(cols["name_id"], cols["end_ns"] - cols["start_ns"])
        if "long_id" in cols:
            named = cols["long_id"] >= 0
            self._long_named = {c: cols[c][named] for c in ("start_ns", "end_ns", "device_id", "name_id", "long_id")}
        for table, name, keep in self._row_filters:
            if table == key and (rows := keep(self, cols)) is not None:
                self._kept_rows[name] = rows
        kept = {c: cols[c] for c in ("start_ns", "end_ns", "device_id", "gpid")}
        # kernel names as string ids (-1 for copies, memsets and unnamed kernels): the step inference reads them
        name_id = cols.get("name_id") if key == "kernel" else None
        kept["name_id"] = np.asarray(name_id, np.int64) if name_id is not None and name_id.dtype.kind in "iu" \
            else np.full(len(cols["start_ns"]), -1, np.int64)
        return kept

    def _one_device_for_unknown(self) -> int | None:
        """When a GPU table cannot say which GPU ran its rows (no deviceId, nothing to infer it from), every GPU op
        is put on one GPU, said in a warning: rows on a phantom "GPU -1" beside the real ones would double every
        idle share and invent an idle GPU. None when every table knows its devices."""
        unknown = [key for key, table in GPU_OP_TABLES.items()
                   if self.reader.has(table) and not self.reader.device_source(key).known]
        if not unknown:
            return None
        listed = self.listed_devices
        target = int(listed.min()) if listed is not None else 0
        listing = self.reader.gpu_count_listed()
        self.warnings.append(
            f"the {' and '.join(unknown)} table{'s have' if len(unknown) > 1 else ' has'} no deviceId column and the "
            f"report does not say which GPU ran each row ({f'it lists {listing} GPUs' if listing else 'it lists no GPU'})"
            f": all GPU activity is analyzed as one GPU, GPU {target}")
        return target

    @cached_property
    def gpu_ops(self) -> pd.DataFrame:
        """Every kernel, memcpy and memset: start_ns, end_ns, device_id, pid, kind (code), name_id (kernels' name
        string id, else -1), sorted by start."""
        parts = []
        self._one_device = self._one_device_for_unknown()
        for code, key in enumerate(GPU_OP_TABLES):
            if self.reader.has(GPU_OP_TABLES[key]):
                cols = self._read_gpu_table(key)
                cols["kind"] = np.full(len(cols["start_ns"]), code, np.int8)
                parts.append(cols)
        if not parts:
            return pd.DataFrame({c: np.empty(0, np.int64)
                                 for c in ("start_ns", "end_ns", "device_id", "pid", "kind", "name_id")})
        start = np.concatenate([p["start_ns"] for p in parts])
        order = np.argsort(start, kind="stable")  # each table is nearly sorted: timsort is ~linear
        data = {"start_ns": start[order]}
        del start
        for c in ("end_ns", "device_id", "gpid", "kind", "name_id"):  # one column at a time: bounded extra memory
            data[c] = np.concatenate([p.pop(c) for p in parts])[order]
        data["pid"] = pid_of(data.pop("gpid"))
        return pd.DataFrame(data, copy=False)

    # ---- NVTX ------------------------------------------------------------------------
    @cached_property
    def ranges(self) -> pd.DataFrame:
        """NVTX ranges: start_ns, end_ns, gtid, pid, name (category), domain, open (never closed)."""
        empty = pd.DataFrame({"start_ns": [], "end_ns": [], "gtid": [], "pid": [], "name": pd.Categorical([]),
                              "open": []})
        read = self.reader.nvtx_ranges()
        if read is None:
            return empty
        cols, label_of = read
        unusable = (cols["start_ns"] < 0) | (cols["gtid"] < 0)
        if unusable.any():
            self.warnings.append(f"{int(unusable.sum())} NVTX range(s) without a start time or a thread (NULL in the "
                                 "export) were left out")
            cols = {k: v[~unusable] for k, v in cols.items()}
            if not len(cols["start_ns"]):
                return empty
        keys = np.array(sorted(label_of), dtype=np.int64)
        domains = {(int(pid_of(g)), d): text for (g, d), text in self.reader.nvtx_domain_names().items()}
        labels = [label_of[int(k)] for k in keys]
        codes = np.searchsorted(keys, cols["key"])
        df = pd.DataFrame({"start_ns": cols["start_ns"], "end_ns": cols["end_ns"], "gtid": cols["gtid"]})
        df["pid"] = pid_of(df["gtid"].to_numpy())
        df["name"] = pd.Categorical.from_codes(codes, categories=pd.Index(labels).unique()) \
            if len(set(labels)) == len(labels) else pd.Categorical(np.asarray(labels, dtype=object)[codes])
        dom = cols["domain"]
        if dom.any():  # ranges of other domains (cuBLAS, cuDNN, user libraries) show as "domain:name"
            dom_names = np.array([domains.get((int(p), int(d)), "") for p, d in zip(df["pid"], dom)], dtype=object)
            mask = (dom != 0) & (dom_names != "")
            if mask.any():
                full = df["name"].astype(object).to_numpy().copy()
                full[mask] = dom_names[mask] + ":" + full[mask]
                df["name"] = pd.Categorical(full)
        df["open"] = df["end_ns"] < 0
        bad = validity.corrupt_ranges(df["start_ns"].to_numpy(), df["end_ns"].to_numpy(), df["open"].to_numpy(),
                                      self.session)
        if bad.any():
            self.warnings.append(f"{int(bad.sum())} NVTX range(s) ending before they start, or outside the capture "
                                 "session, were left out")
            df = df[~bad].reset_index(drop=True)
        if df["open"].any():
            n_open = int(df["open"].sum())
            self.warnings.append(f"{n_open} NVTX range(s) never closed; they are treated as ending at the end of the trace")
            last = int(max(df["end_ns"].max(), df["start_ns"].max(),
                           self.gpu_ops["end_ns"].max() if self.has_gpu_activity and len(self.gpu_ops) else 0))
            df.loc[df["open"], "end_ns"] = last
        return df

    # ---- CUDA API calls ------------------------------------------------------------
    @cached_property
    def api_names(self) -> dict[int, str]:
        """String id -> base name of every string that can name a CUDA runtime/driver call.

        Read from the string table (thousands of rows), not as DISTINCT over the runtime table (millions).
        """
        if not self.reader.has(RUNTIME):
            return {}
        return {i: api_base_name(n) for i, n in self.reader.api_name_strings().items()}

    def want_rows(self, table_key: str, name: str, keep: Callable) -> None:
        """Announce a question's own pick of one GPU table's rows, made while the table is read (the columns
        dropped after it, a grid size, are there): ``keep(trace, columns)`` -> the rows' columns, or None."""
        if "gpu_ops" in self.__dict__:
            raise RuntimeError("want_rows() must come before the GPU tables are read")
        self._row_filters.append((table_key, name, keep))

    def rows(self, name: str) -> dict[str, np.ndarray] | None:
        """The rows announced with want_rows as ``name``; None where its filter kept none (or, merged, for ever)."""
        _ = self.gpu_ops
        return getattr(self, "_kept_rows", {}).get(name)

    def want_long_names(self, short_ids: list[int]) -> None:
        """Announce that kernels with these short names should bring their demangled names (one kernel pass)."""
        if "gpu_ops" in self.__dict__:
            raise RuntimeError("want_long_names() must come before the GPU tables are read")
        self._long_names_of = tuple(sorted(set(self._long_names_of) | {int(i) for i in short_ids}))

    def long_named_kernels(self) -> pd.DataFrame | None:
        """start_ns, end_ns, device_id, name_id, long_id of the kernels announced by want_long_names (valid rows
        on listed devices); None when none were announced or the export has no demangled names."""
        _ = self.gpu_ops
        named = getattr(self, "_long_named", None)  # a merged trace keeps none
        return None if named is None else pd.DataFrame(named)

    def want_launches(self, table_key: str, column: str, ids: list[int]) -> None:
        """Announce a later ``launches_of`` so the CPU calls behind those GPU ops come with the one runtime pass."""
        if self._runtime_read is not None or "gpu_ops" in self.__dict__:
            raise RuntimeError("want_launches() must come before the GPU and runtime tables are read")
        self._launch_requests.append((table_key, column, tuple(sorted(ids))))

    def start_runtime_read(self) -> None:
        """Scan the runtime table on a second connection while this thread reads the GPU tables.

        The two scans are most of the time spent on a long run's export, and SQLite releases the GIL
        while it scans, so on two cores they overlap. Call after every want_launches(); close() stops it.
        """
        if self._runtime_read is not None or not self.reader.has(RUNTIME):
            return
        ids = [i for i, n in self.api_names.items() if any(f.search(n) for f in PRELOAD_FILTERS)]
        columns, sql = self.reader.runtime_query(ids, SLOW_API_NS, self._launch_requests)
        own = self._runtime_reader = Reader(self.info.path)
        future: Future = Future()

        def read() -> None:
            try:
                future.set_result(own.columns(columns, sql))
            except BaseException as exc:  # handed to whoever waits for the result
                future.set_exception(exc)
            finally:
                own.close()

        # A daemon thread: an analysis that fails early must not wait for this scan at exit.
        threading.Thread(target=read, name="nvtx-trace-runtime", daemon=True).start()
        self._runtime_read = future

    def close(self) -> None:
        """Stop a runtime scan nobody will read (the analysis failed or was interrupted)."""
        own = self._runtime_reader
        if own is not None and self._runtime_read is not None and not self._runtime_read.done():
            try:
                own.interrupt()
            except Exception:  # already closed by its thread
                pass

    @cached_property
    def _runtime(self) -> pd.DataFrame:
        """The runtime calls every analysis uses, from one scan of the runtime table (millions of rows in long runs)."""
        if not self.reader.has(RUNTIME):
            return pd.DataFrame({c: np.empty(0, np.int64) for c in RUNTIME_COLUMNS}).assign(
                pid=np.empty(0, np.int64), name=pd.Categorical([]))
        self.start_runtime_read()
        cols = self._runtime_read.result()
        self._runtime_reader = None
        unusable = (cols["start_ns"] < 0) | (cols["end_ns"] < cols["start_ns"]) | (cols["gtid"] < 0)
        if unusable.any():
            self.warnings.append(f"{int(unusable.sum())} CUDA API call(s) without a valid start/end or a thread (NULL "
                                 "in the export, or ending before they start) were left out")
            cols = {k: v[~unusable] for k, v in cols.items()}
        df = pd.DataFrame(cols)
        df["pid"] = pid_of(df["gtid"].to_numpy())
        unknown = set(np.unique(df["name_id"]).tolist()) - set(self.api_names)
        if unknown:  # a call whose name does not start with "cu": resolve it all the same
            self.api_names.update({i: api_base_name(n) for i, n in self.reader.strings(unknown).items()})
        df["name"] = pd.Categorical(df["name_id"].map(self.api_names))
        return df

    def api_calls(self, name_filter: re.Pattern | None = None, min_duration_ns: int = 0) -> pd.DataFrame:
        """Runtime/driver API calls whose name matches one of PRELOAD_FILTERS, or that last at least
        ``min_duration_ns`` (>= SLOW_API_NS): the rows the single runtime pass holds."""
        if name_filter not in (None, *PRELOAD_FILTERS) or 0 < min_duration_ns < SLOW_API_NS:
            raise ValueError("api_calls() serves PRELOAD_FILTERS and calls of at least SLOW_API_NS only")
        rt = self._runtime
        keep = np.zeros(len(rt), dtype=bool)
        if name_filter is not None:
            keep |= rt["name_id"].isin([i for i, n in self.api_names.items() if name_filter.search(n)]).to_numpy()
        if min_duration_ns:
            keep |= (rt["end_ns"] - rt["start_ns"]).to_numpy() >= min_duration_ns
        return rt[keep].reset_index(drop=True)

    # ---- kernels ------------------------------------------------------------------
    @property
    def _kernel_time_by_id(self) -> pd.DataFrame:
        """Count and GPU time per kernel name id, summed while the kernel table was read."""
        _ = self.gpu_ops
        return self._kernel_times

    @cached_property
    def kernel_name_column(self) -> str | None:
        return self.reader.kernel_name_column

    def kernel_time_by_name(self) -> pd.DataFrame:
        """Total GPU time per kernel name: name, count, time_ns."""
        by_id = self._kernel_time_by_id
        if not len(by_id):
            return pd.DataFrame({"name": [], "count": [], "time_ns": []})
        names = self.reader.strings(by_id["name_id"].tolist())
        df = pd.DataFrame({"name": [names[i] for i in by_id["name_id"].tolist()], "count": by_id["count"].to_numpy(),
                           "time_ns": by_id["time_ns"].to_numpy()})
        return df.groupby("name", as_index=False).sum().sort_values("time_ns", ascending=False, ignore_index=True)

    def launches_of(self, table_key: str, column: str, ids: list[int]) -> pd.DataFrame:
        """GPU ops whose ``column`` is one of ``ids`` (announced with want_launches), each joined to the CPU
        call that issued it (same process, same correlation id); api_* are -1 (api_gtid 0) where none was recorded."""
        if (table_key, column, tuple(sorted(ids))) not in self._launch_requests:
            raise RuntimeError(f"launches_of({table_key!r}, ...) was not announced with want_launches()")
        _ = self.gpu_ops
        df = pd.DataFrame(self._launch_rows.get((table_key, column, tuple(sorted(ids))))
                          or {c: np.empty(0, np.int64) for c in ("start_ns", "end_ns", "device_id", "gpid", "corr")})
        api = _match_calls(df["corr"].to_numpy(), df["gpid"].to_numpy(), self._runtime)
        for c, v in api.items():
            df[c] = v
        df["pid"] = pid_of(df.pop("gpid").to_numpy())
        return df


def _time_by_id(name_id: np.ndarray, duration_ns: np.ndarray) -> pd.DataFrame:
    """Count and summed duration per name id; bincount, not a sort, as string ids are small integers."""
    if not len(name_id):
        return pd.DataFrame({"name_id": np.empty(0, np.int64), "count": np.empty(0, np.int64),
                             "time_ns": np.empty(0, np.int64)})
    if name_id.min() >= 0 and name_id.max() < 4 * len(name_id) + 1_000_000:
        ids, inverse = np.arange(int(name_id.max()) + 1), name_id
    else:
        ids, inverse = np.unique(name_id, return_inverse=True)
    count = np.bincount(inverse, minlength=len(ids))
    time_ns = np.bincount(inverse, weights=duration_ns, minlength=len(ids))  # float64: exact below 2**53 ns
    present = np.nonzero(count)[0]
    return pd.DataFrame({"name_id": ids[present], "count": count[present].astype(np.int64),
                         "time_ns": np.rint(time_ns[present]).astype(np.int64)})


def _match_calls(corr: np.ndarray, gpid: np.ndarray, calls: pd.DataFrame) -> dict[str, np.ndarray]:
    """For each GPU op, the runtime call with its correlation id in its process (a sort and a binary search:
    pandas' merge on two keys costs ~5x more at a million launches)."""
    out = {"api_start_ns": np.full(len(corr), -1, np.int64), "api_end_ns": np.full(len(corr), -1, np.int64),
           "api_gtid": np.zeros(len(corr), np.int64), "api_name_id": np.full(len(corr), -1, np.int64)}
    if not len(corr) or not len(calls):
        return out
    # correlationIds are 32-bit and pids 24-bit: one int64 key per (process, call)
    call_key = (pid_of(calls["gtid"].to_numpy()) << 32) | (calls["corr"].to_numpy() & 0xFFFFFFFF)
    op_key = (pid_of(gpid) << 32) | (corr & 0xFFFFFFFF)
    order = np.argsort(call_key, kind="stable")
    sorted_key = call_key[order]
    pos = np.minimum(np.searchsorted(sorted_key, op_key), len(sorted_key) - 1)
    hit = (sorted_key[pos] == op_key) & (corr >= 0)
    row = order[pos[hit]]
    for name, col in (("api_start_ns", "start_ns"), ("api_end_ns", "end_ns"), ("api_gtid", "gtid"),
                      ("api_name_id", "name_id")):
        out[name][hit] = calls[col].to_numpy()[row]
    return out
