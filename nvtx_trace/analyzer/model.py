"""Decoded tables the analyses share: integer ``*_ns`` columns, names resolved, pids split out.

Each table is loaded once, lazily, with only the columns the analyses need.
Names stay as pandas categoricals so millions of rows cost one int each.
"""

from __future__ import annotations

import re
from functools import cached_property

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.reader import GPU_OP_TABLES, PID_MASK, RANGE_EVENT_TYPES, RUNTIME, Reader

GPU_OP_KINDS = list(GPU_OP_TABLES)  # code = index: 0 kernel, 1 memcpy, 2 memset

# CUDA runtime/driver calls that block the calling CPU thread until the GPU catches up.
SYNC_API_RE = re.compile(
    r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|cudaStreamQuery|cudaEventQuery"
    r"|cuCtxSynchronize|cuStreamSynchronize|cuEventSynchronize|cudaMemcpy(?!.*Async)|cudaMemcpy2D(?!.*Async)"
    r"|cuMemcpyDtoH(?!.*Async)|cuMemcpyHtoD(?!.*Async)|cudaMemset(?!.*Async)|cudaFree(?!Host|Async))(_v\d+)?$"
)
COPY_API_RE = re.compile(r"^(cudaMemcpy|cuMemcpy)")
SLOW_API_NS = 50_000  # CUDA calls at least this long are worth naming (cudaMalloc, module loads)
PRELOAD_FILTERS = (SYNC_API_RE, COPY_API_RE)  # the runtime calls the analyses ask for by name

LAUNCH_API_RE = re.compile(r"^(cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch)")


def pid_of(gtid: np.ndarray) -> np.ndarray:
    """OS pid from globalTid/globalPid (bits 24-47)."""
    return (np.asarray(gtid, dtype=np.int64) >> 24) & 0xFFFFFF


def tid_of(gtid: np.ndarray) -> np.ndarray:
    return np.asarray(gtid, dtype=np.int64) & 0xFFFFFF


def api_base_name(name: str) -> str:
    """``cudaStreamSynchronize_v3020`` -> ``cudaStreamSynchronize``."""
    return re.sub(r"_v\d+$", "", name)


class Trace:
    """Lazily decoded view of one export."""

    def __init__(self, reader: Reader):
        self.reader = reader
        self.info = reader.info
        self.warnings: list[str] = []
        self._api_cache: dict[tuple, pd.DataFrame] = {}
        self._launch_requests: list[tuple[str, str]] = []  # (table key, where) read with the runtime pass

    # ---- time and entities ---------------------------------------------------
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
        return any(self.reader.nonempty(t) for t in GPU_OP_TABLES.values())

    @cached_property
    def gpu_ops(self) -> pd.DataFrame:
        """Every kernel, memcpy and memset: start_ns, end_ns, device_id, pid, kind (code), sorted by start."""
        parts = []
        for code, table in enumerate(GPU_OP_TABLES.values()):
            if not self.reader.has(table):
                continue
            cols = self.reader.columns(
                {"start_ns": "start", "end_ns": "end", "device_id": "deviceId", "gpid": "globalPid"},
                f"{table} WHERE start > 0 AND end >= start",
            )
            cols["kind"] = np.full(len(cols["start_ns"]), code, dtype=np.int8)
            parts.append(cols)
        if not parts:
            return pd.DataFrame({c: np.empty(0, np.int64) for c in ("start_ns", "end_ns", "device_id", "pid", "kind")})
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(merged["start_ns"], kind="stable")  # each table is nearly sorted: timsort is ~linear
        df = pd.DataFrame({k: v[order] for k, v in merged.items()})
        df["pid"] = pid_of(df.pop("gpid").to_numpy())
        return df

    # ---- NVTX ------------------------------------------------------------------------
    @cached_property
    def ranges(self) -> pd.DataFrame:
        """NVTX ranges: start_ns, end_ns, gtid, pid, name (category), domain, open (never closed)."""
        r = self.reader
        empty = pd.DataFrame({"start_ns": [], "end_ns": [], "gtid": [], "pid": [], "name": pd.Categorical([]),
                              "open": []})
        if not r.has("NVTX_EVENTS"):
            return empty
        types = ",".join(map(str, RANGE_EVENT_TYPES))
        has_text_id = r.has("NVTX_EVENTS", "textId")
        # Unregistered strings arrive in `text`: give each distinct one a negative key.
        r.conn.execute("DROP TABLE IF EXISTS temp.nvtx_text")
        r.conn.execute(
            f"CREATE TEMP TABLE nvtx_text AS SELECT DISTINCT text FROM NVTX_EVENTS "
            f"WHERE text IS NOT NULL AND eventType IN ({types})" + (" AND textId IS NULL" if has_text_id else "")
        )
        r.conn.execute("CREATE INDEX temp.nvtx_text_i ON nvtx_text(text)")
        text_key = "-(SELECT rowid FROM temp.nvtx_text t WHERE t.text = n.text)"
        key = f"COALESCE(n.textId, {text_key}, 0)" if has_text_id else f"COALESCE({text_key}, 0)"
        domain = "n.domainId" if r.has("NVTX_EVENTS", "domainId") else "0"
        cols = r.columns(
            {"start_ns": "n.start", "end_ns": "COALESCE(n.end, -1)", "gtid": "n.globalTid", "key": key,
             "domain": f"COALESCE({domain}, 0)"},
            f"NVTX_EVENTS n WHERE n.eventType IN ({types}) AND n.start > 0",
        )
        if not len(cols["start_ns"]):
            return empty
        keys = np.unique(cols["key"])
        names = r.strings(keys[keys > 0])
        texts = dict(r.conn.execute("SELECT -rowid, text FROM temp.nvtx_text").fetchall())
        domains = self._domain_names()
        labels = [names.get(int(k)) or texts.get(int(k)) or "" for k in keys]
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
        if df["open"].any():
            n_open = int(df["open"].sum())
            self.warnings.append(f"{n_open} NVTX range(s) never closed; they are treated as ending at the end of the trace")
            last = int(max(df["end_ns"].max(), df["start_ns"].max(),
                           self.gpu_ops["end_ns"].max() if self.has_gpu_activity and len(self.gpu_ops) else 0))
            df.loc[df["open"], "end_ns"] = last
        return df

    def _domain_names(self) -> dict[tuple[int, int], str]:
        rows = self.reader.conn.execute(
            "SELECT globalTid, domainId, COALESCE(text, '') FROM NVTX_EVENTS WHERE eventType = 75"
            if self.reader.has("NVTX_EVENTS", "domainId") else "SELECT 0, 0, '' WHERE 0"
        ).fetchall()
        out = {}
        for gtid, dom, text in rows:
            out[(int(pid_of(gtid)), int(dom or 0))] = text
        return out

    # ---- CUDA API calls ------------------------------------------------------------
    @cached_property
    def api_names(self) -> dict[int, str]:
        if not self.reader.has(RUNTIME):
            return {}
        ids = [i for (i,) in self.reader.conn.execute(f"SELECT DISTINCT nameId FROM {RUNTIME}")]
        return {i: api_base_name(n) for i, n in self.reader.strings(ids).items()}

    def want_launches(self, table_key: str, where: str) -> None:
        """Announce a later ``launches_of(table_key, where)`` so its CPU calls come with the one runtime pass."""
        if "_runtime" in self.__dict__:
            raise RuntimeError("want_launches() must come before the runtime table is read")
        self._launch_requests.append((table_key, where))

    @cached_property
    def _runtime(self) -> pd.DataFrame:
        """One scan of the runtime table (millions of rows in long runs) for everything the analyses use:
        calls named by PRELOAD_FILTERS, calls of at least SLOW_API_NS, and the launches announced."""
        ids = [i for i, n in self.api_names.items() if any(f.search(n) for f in PRELOAD_FILTERS)]
        cond = [f"end - start >= {SLOW_API_NS}"]
        if ids:
            cond.append(f"nameId IN ({','.join(map(str, ids))})")
        for table_key, where in self._launch_requests:
            cond.append(f"correlationId IN (SELECT g.correlationId FROM {GPU_OP_TABLES[table_key]} g WHERE ({where}))")
        return self._read_api_calls(" OR ".join(cond))

    def api_calls(self, name_filter: re.Pattern | None = None, min_duration_ns: int = 0) -> pd.DataFrame:
        """Runtime/driver API calls whose name matches, or that last at least ``min_duration_ns``.

        Served from the single runtime pass when it covers the request; callers get their own copy.
        """
        cols = ["start_ns", "end_ns", "gtid", "corr", "name_id"]
        if not self.reader.has(RUNTIME):
            return pd.DataFrame({c: np.empty(0, np.int64) for c in cols}).assign(
                pid=np.empty(0, np.int64), name=pd.Categorical([]))
        covered = (name_filter is None or name_filter in PRELOAD_FILTERS) and \
            (min_duration_ns == 0 or min_duration_ns >= SLOW_API_NS)
        if not covered:
            key = (name_filter.pattern if name_filter is not None else None, int(min_duration_ns))
            if key not in self._api_cache:
                self._api_cache[key] = self._load_api_calls(name_filter, min_duration_ns)
            return self._api_cache[key].copy()
        rt = self._runtime
        keep = np.zeros(len(rt), dtype=bool)
        if name_filter is not None:
            ids = [i for i, n in self.api_names.items() if name_filter.search(n)]
            keep |= rt["name_id"].isin(ids).to_numpy()
        if min_duration_ns:
            keep |= (rt["end_ns"] - rt["start_ns"]).to_numpy() >= min_duration_ns
        return rt[keep].reset_index(drop=True)

    def _load_api_calls(self, name_filter: re.Pattern | None, min_duration_ns: int) -> pd.DataFrame:
        cols = ["start_ns", "end_ns", "gtid", "corr", "name_id"]
        if not self.reader.has(RUNTIME):
            return pd.DataFrame({c: np.empty(0, np.int64) for c in cols}).assign(name=pd.Categorical([]))
        ids = [i for i, n in self.api_names.items() if name_filter is not None and name_filter.search(n)]
        cond = []
        if ids:
            cond.append(f"nameId IN ({','.join(map(str, ids))})")
        if min_duration_ns:
            cond.append(f"end - start >= {int(min_duration_ns)}")
        return self._read_api_calls(" OR ".join(cond) or "0")

    def _read_api_calls(self, where: str) -> pd.DataFrame:
        data = self.reader.columns(
            {"start_ns": "start", "end_ns": "end", "gtid": "globalTid", "corr": "correlationId", "name_id": "nameId"},
            f"{RUNTIME} WHERE ({where})",
        )
        df = pd.DataFrame(data)
        df["pid"] = pid_of(df["gtid"].to_numpy())
        df["name"] = pd.Categorical(df["name_id"].map(self.api_names))
        return df

    # ---- kernels ------------------------------------------------------------------
    def kernel_name_ids(self) -> dict[int, str]:
        """Distinct kernel names (short names where the export has them) of kernels with a valid start."""
        ids = self._kernel_time_by_id["name_id"]
        return self.reader.strings(ids.tolist()) if len(ids) else {}

    @cached_property
    def _kernel_time_by_id(self) -> pd.DataFrame:
        """Count and GPU time per kernel name id (start > 0).

        Summed in numpy over two bulk columns: SQLite's GROUP BY on an unindexed column
        sorts every row, ~4x slower on million-kernel exports.
        """
        col = self.kernel_name_column
        if not col:
            return pd.DataFrame({"name_id": np.empty(0, np.int64), "count": np.empty(0, np.int64),
                                 "time_ns": np.empty(0, np.int64)})
        data = self.reader.columns({"name_id": f"COALESCE({col}, -1)", "time_ns": "end - start"},
                                   f"{GPU_OP_TABLES['kernel']} WHERE start > 0")
        ids, inverse = np.unique(data["name_id"], return_inverse=True)
        time_ns = np.zeros(ids.size, np.int64)
        np.add.at(time_ns, inverse, data["time_ns"])
        return pd.DataFrame({"name_id": ids, "count": np.bincount(inverse, minlength=ids.size).astype(np.int64),
                             "time_ns": time_ns})

    @cached_property
    def kernel_name_column(self) -> str | None:
        for col in ("shortName", "demangledName", "name"):
            if self.reader.has(GPU_OP_TABLES["kernel"], col):
                return col
        return None

    def kernel_time_by_name(self) -> pd.DataFrame:
        """Total GPU time per kernel name (SQL-side aggregate): name, count, time_ns."""
        by_id = self._kernel_time_by_id
        if not len(by_id):
            return pd.DataFrame({"name": [], "count": [], "time_ns": []})
        names = self.reader.strings(by_id["name_id"].tolist())
        df = pd.DataFrame({"name": [names[i] for i in by_id["name_id"].tolist()], "count": by_id["count"].to_numpy(),
                           "time_ns": by_id["time_ns"].to_numpy()})
        return df.groupby("name", as_index=False).sum().sort_values("time_ns", ascending=False, ignore_index=True)

    def launches_of(self, table_key: str, where: str) -> pd.DataFrame:
        """GPU ops matching ``where`` joined to the CPU call that issued them (same process, same correlationId)."""
        table = GPU_OP_TABLES[table_key]
        have_rt = self.reader.has(RUNTIME)
        sel = {"start_ns": "g.start", "end_ns": "g.end", "device_id": "g.deviceId", "gpid": "g.globalPid",
               "corr": "g.correlationId"}
        extra = {"kernel": {"name_id": f"g.{self.kernel_name_column}"} if self.kernel_name_column else {},
                 "memcpy": {"bytes": "g.bytes", "copy_kind": "g.copyKind", "src_kind": "g.srcKind",
                            "dst_kind": "g.dstKind"},
                 "memset": {"bytes": "g.bytes"}}[table_key]
        sel.update(extra)
        df = pd.DataFrame(self.reader.columns(sel, f"{table} g WHERE ({where})"))
        api_cols = {"api_start_ns": -1, "api_end_ns": -1, "api_gtid": 0, "api_name_id": -1}
        if have_rt and len(df):
            # Join in pandas, not SQL: SQLite would build an automatic index over the whole runtime
            # table (millions of rows) for every call. Only calls whose correlationId is wanted are read.
            if (table_key, where) in self._launch_requests:
                rt = self._runtime
                calls = pd.DataFrame({"corr": rt["corr"].to_numpy(), "gpid": rt["gtid"].to_numpy() & PID_MASK,
                                      "api_start_ns": rt["start_ns"].to_numpy(), "api_end_ns": rt["end_ns"].to_numpy(),
                                      "api_gtid": rt["gtid"].to_numpy(), "api_name_id": rt["name_id"].to_numpy()})
                calls = calls[calls["corr"].isin(df["corr"].unique())]
            else:
                calls = pd.DataFrame(self.reader.columns(
                    {"corr": "correlationId", "gpid": f"COALESCE(globalTid & {PID_MASK}, -1)",
                     "api_start_ns": "start", "api_end_ns": "end", "api_gtid": "COALESCE(globalTid, 0)",
                     "api_name_id": "nameId"},
                    f"{RUNTIME} WHERE correlationId IN (SELECT g.correlationId FROM {table} g WHERE ({where}))"))
            calls = calls.astype({c: "Int64" for c in api_cols})  # nullable: unmatched ops keep exact integers
            df = df.merge(calls, on=["corr", "gpid"], how="left", sort=False)
            for c, v in api_cols.items():
                df[c] = df[c].fillna(v).astype(np.int64)
        else:
            for c, v in api_cols.items():
                df[c] = np.full(len(df), v, dtype=np.int64)
        df["pid"] = pid_of(df.pop("gpid").to_numpy()) if len(df) else np.empty(0, np.int64)
        return df
