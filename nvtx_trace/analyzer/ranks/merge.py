"""Several decoded reports (one per rank) joined into one Trace, as if one report held them all.

Times move onto one clock (clocks.py). Processes and GPUs keep their ids, except where an id
of one host's report collides with another host's (every container has a pid 1, every node a
GPU 0): those get the next free id, said in a warning. String ids are each report's own, so
names are re-keyed by their text; enum codes by their label. The result is a ``Trace`` whose
tables are already loaded: the analysis pipeline runs on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from nvtx_trace.analyzer.ranks.clocks import ClockPlan
from nvtx_trace.analyzer.trace.decoded import DecodedReport
from nvtx_trace.analyzer.trace.reader import MEM_KIND_ENUM, MEMCPY_OPER_ENUM, RUNTIME, Reader, ReportInfo
from nvtx_trace.analyzer.trace.tables import Trace, pid_of


@dataclass
class RankSource:
    """Where one rank's rows came from, and the ids they carry in the merged trace."""

    index: int
    path: Path
    pids: list[int]  # processes with GPU work or NVTX ranges, merged ids
    devices: list[int]  # GPUs it ran work on, merged ids
    session: int  # capture session (clock) it belongs to
    offset_ns: int  # added to its timestamps


class MergedReader:
    """The reader-side questions the analyses ask (strings, enums, which columns exist), answered from
    the decoded reports instead of a database."""

    conn = None
    enum_id, htod_copy_kind, memory_kind = Reader.enum_id, Reader.htod_copy_kind, Reader.memory_kind  # via enum()

    def __init__(self, info: ReportInfo, strings: dict[int, str], enums: dict[str, dict[int, str]],
                 columns: dict[str, set[str]], cpu_cores: int | None):
        self.info, self._strings, self._enums, self._columns, self._cores = info, strings, enums, columns, cpu_cores

    def close(self) -> None:
        pass

    def has(self, table: str, column: str | None = None) -> bool:
        if table not in self.info.tables:
            return False
        return column is None or column in self._columns.get(table, ())

    def has_cuda_api(self) -> bool:
        """Whether CUDA API calls (the runtime table) were recorded: syncs and launches need them."""
        return self.has(RUNTIME)

    def memory_usage(self) -> None:
        """Several ranks: each rank's memory comes from its own allocator records, not nsys's trace."""
        return None

    def strings(self, ids) -> dict[int, str]:
        return {int(i): self._strings.get(int(i), f"<string {int(i)}>") for i in ids}

    def string_ids(self, like_any, pattern) -> list[int]:
        return sorted(i for i, v in self._strings.items() if pattern.search(v))

    def enum(self, table: str, fallback: dict[int, str]) -> dict[int, str]:
        return dict(self._enums.get(table) or fallback)

    def cpu_cores(self) -> int | None:
        return self._cores


class MergedTrace(Trace):
    """A Trace whose tables come from several decoded reports; the launches every report read are kept,
    and each unit's request is served from them."""

    def __init__(self, reader: MergedReader, tables: dict, launches: dict, warnings: list[str],
                 ranks: list[RankSource], clock: ClockPlan):
        self.reader, self.info, self.warnings = reader, reader.info, warnings
        self._launch_requests, self._launch_rows = [], {}
        self._runtime_read = self._runtime_reader = None
        self._kernel_times = tables.pop("kernel_times")
        self._read_launches = launches
        self.ranks, self.clock = ranks, clock
        self.pid_hosts: dict[int, str] = {}  # merged pid -> its host's name, where the report names it
        self.__dict__.update(tables)  # the cached properties of Trace, already computed

    def want_launches(self, table_key: str, column: str, ids: list[int]) -> None:
        request = (table_key, column, tuple(sorted(ids)))
        rows = self._read_launches.get((table_key, column))
        if rows is not None:
            keep = np.isin(rows[column], request[2])
            self._launch_rows[request] = {c: v[keep] for c, v in rows.items()}
        self._launch_requests.append(request)

    def start_runtime_read(self) -> None:
        pass  # every report's runtime rows were read with it

    def want_long_names(self, short_ids: list[int]) -> None:
        pass  # each report brought its kernels' demangled names when it was read (decoded.DecodedReport.long_named)

    def want_rows(self, table_key: str, name: str, keep) -> None:
        pass  # a question's own pick of a table's rows is made per report, and no report carries it


class _Ids:
    """Old id -> merged id for one kind of id (pids, GPUs): an id seen on another host gets a free one."""

    def __init__(self):
        self.given: dict[tuple[object, int], int] = {}  # (host, its own id) -> merged id, for every report
        self.moved: list[str] = []

    def plan(self, ids: set[int], host, label: str, kind: str) -> dict[int, int]:
        """The same host's id keeps its merged id across its reports; a free id stays; the rest get new ones."""
        used = set(self.given.values())
        out = {i: self.given[(host, i)] for i in ids if (host, i) in self.given}
        for i in sorted(ids - set(out)):  # first the free ids, so that no move lands on one this report uses
            if i not in used:
                out[i] = self.given[(host, i)] = i
                used.add(i)
        for i in sorted(ids - set(out)):
            new = max(used | ids) + 1
            out[i] = self.given[(host, i)] = new
            used.add(new)
            self.moved.append(f"{label}'s {kind} {i} is shown as {kind} {new}")
        return out


def _remap(values: np.ndarray, mapping: dict[int, int]) -> np.ndarray:
    values = np.asarray(values, np.int64)
    if not mapping or all(k == v for k, v in mapping.items()):
        return values
    keys = np.array(sorted(mapping), np.int64)
    vals = np.array([mapping[k] for k in keys], np.int64)
    pos = np.clip(np.searchsorted(keys, values), 0, len(keys) - 1)
    hit = keys[pos] == values
    return np.where(hit, vals[pos], values)


def _remap_gtid(gtid: np.ndarray, pids: dict[int, int]) -> np.ndarray:
    gtid = np.asarray(gtid, np.int64)
    old = pid_of(gtid)
    return gtid + ((_remap(old, pids) - old) << 24)


def merge(reports: list[DecodedReport], clock: ClockPlan) -> MergedTrace:
    """One trace of every report, on the first report's clock."""
    strings: dict[str, int] = {}

    def intern(text: str) -> int:
        return strings.setdefault(text, len(strings))

    hosts = _hosts(reports, clock)
    pid_ids, dev_ids = _Ids(), _Ids()
    enums = _reference_enums(reports)
    parts: dict[str, list] = {k: [] for k in ("gpu_ops", "ranges", "runtime", "kernel_times", "long_named")}
    launches: dict[tuple[str, str], list[dict]] = {}
    names = {"gpu_names": {}, "thread_names": {}, "process_names": {}}
    api_names: dict[int, str] = {}
    warnings: list[str] = []
    ranks, pid_hosts = [], {}
    for i, r in enumerate(reports):
        off = clock.offset_of(i)
        label = r.path.name
        pids = pid_ids.plan(r.pids(), hosts[i], label, "pid")
        devs = dev_ids.plan(r.devices() | {int(d) for c in r.launch_rows.values() for d in np.unique(c["device_id"])},
                            hosts[i], label, "GPU")
        kernel = {k: intern(v) for k, v in r.strings.items()}
        api = {k: intern(v) for k, v in r.api_names.items()}
        api_names.update({api[k]: v for k, v in r.api_names.items()})
        kinds = {e: _by_label(r.enums.get(e, {}), enums.get(e, {})) for e in enums}
        parts["gpu_ops"].append(r.gpu_ops.assign(
            start_ns=r.gpu_ops["start_ns"] + off, end_ns=r.gpu_ops["end_ns"] + off,
            device_id=_remap(r.gpu_ops["device_id"], devs), pid=_remap(r.gpu_ops["pid"], pids),
            name_id=_remap(r.gpu_ops["name_id"], kernel)))
        parts["ranges"].append(r.ranges.assign(
            start_ns=r.ranges["start_ns"] + off, end_ns=r.ranges["end_ns"] + off,
            gtid=_remap_gtid(r.ranges["gtid"], pids), pid=_remap(r.ranges["pid"], pids)))
        parts["runtime"].append(r.runtime.drop(columns="name").assign(
            start_ns=r.runtime["start_ns"] + off, end_ns=r.runtime["end_ns"] + off,
            gtid=_remap_gtid(r.runtime["gtid"], pids), pid=_remap(r.runtime["pid"], pids),
            name_id=_remap(r.runtime["name_id"], api)))
        parts["kernel_times"].append(r.kernel_times.assign(name_id=_remap(r.kernel_times["name_id"], kernel)))
        if r.long_named is not None:
            ln = r.long_named
            parts["long_named"].append({"start_ns": ln["start_ns"] + off, "end_ns": ln["end_ns"] + off,
                                        "device_id": _remap(ln["device_id"], devs),
                                        "name_id": _remap(ln["name_id"], kernel), "long_id": _remap(ln["long_id"], kernel)})
        for key, cols in r.launch_rows.items():
            cols = dict(cols)
            cols["start_ns"], cols["end_ns"] = cols["start_ns"] + off, cols["end_ns"] + off
            cols["device_id"], cols["gpid"] = _remap(cols["device_id"], devs), _remap_gtid(cols["gpid"], pids)
            if "name_id" in cols:
                cols["name_id"] = _remap(cols["name_id"], kernel)
            for c in ("copy_kind",) if "copy_kind" in cols else ():
                cols[c] = _remap(cols[c], kinds.get(MEMCPY_OPER_ENUM, {}))
            for c in ("src_kind", "dst_kind"):
                if c in cols:
                    cols[c] = _remap(cols[c], kinds.get(MEM_KIND_ENUM, {}))
            launches.setdefault(key, []).append(cols)
        names["gpu_names"].update({devs[d]: n for d, n in r.gpu_names.items() if d in devs})
        names["thread_names"].update({int(_remap_gtid(np.array([g]), pids)[0]): n for g, n in r.thread_names.items()
                                      if int(pid_of(g)) in pids})
        names["process_names"].update({pids[p]: n for p, n in r.process_names.items() if p in pids})
        warnings += [f"{label}: {w}" for w in r.warnings]
        if r.host is not None:
            pid_hosts.update({p: str(r.host) for p in pids.values()})
        ranks.append(RankSource(i, r.path, sorted(pids[p] for p in r.active_pids()),
                                sorted(devs[d] for d in r.devices()), clock.session_of(i), off))
    moved = pid_ids.moved + dev_ids.moved
    if moved:
        warnings.append(f"{len(moved)} id(s) collide between hosts and were renumbered: " + "; ".join(moved[:5])
                        + (" ..." if len(moved) > 5 else ""))
    warnings += clock.warnings
    tables = _concat(parts, api_names)
    tables.update(names, api_names=api_names, session=_session(reports, clock), kernel_name_column=next(
        (r.kernel_name_column for r in reports if r.kernel_name_column), None), listed_devices=None)
    reader = MergedReader(_info(reports, tables["session"]), {v: k for k, v in strings.items()}, enums,
                          _columns(reports), _cores(reports))
    joined = {k: {c: np.concatenate([p[c] for p in v]) for c in v[0]} for k, v in launches.items()}
    merged = MergedTrace(reader, tables, joined, warnings, ranks, clock)
    merged.pid_hosts = pid_hosts
    return merged


def _concat(parts: dict[str, list], api_names: dict[int, str]) -> dict:
    ops = pd.concat(parts["gpu_ops"], ignore_index=True)
    order = np.argsort(ops["start_ns"].to_numpy(), kind="stable")
    ops = ops.iloc[order].reset_index(drop=True)
    frames = parts["ranges"]
    cats = union_categoricals([f["name"] for f in frames])
    ranges = pd.concat([f.drop(columns="name") for f in frames], ignore_index=True)
    ranges.insert(list(frames[0].columns).index("name"), "name", cats)
    runtime = pd.concat(parts["runtime"], ignore_index=True)
    runtime["name"] = pd.Categorical(runtime["name_id"].map(api_names))
    kt = pd.concat(parts["kernel_times"], ignore_index=True)
    kt = kt.groupby("name_id", as_index=False).sum() if len(kt) else kt
    named = parts["long_named"]
    long_named = {c: np.concatenate([p[c] for p in named]) for c in named[0]} if named else None
    return {"gpu_ops": ops, "ranges": ranges, "_runtime": runtime, "kernel_times": kt, "_long_named": long_named,
            "has_gpu_activity": len(ops) > 0}


def _hosts(reports: list[DecodedReport], clock: ClockPlan) -> list[object]:
    """Which reports' ids name the same processes and GPUs: those of one session, or of one known host."""
    out = []
    for i, r in enumerate(reports):
        out.append(("host", r.host) if r.host is not None else ("session", clock.session_of(i)))
    return out


def _by_label(own: dict[int, str], ref: dict[int, str]) -> dict[int, int]:
    by_label = {v.lower(): k for k, v in ref.items()}
    return {k: by_label[v.lower()] for k, v in own.items() if v.lower() in by_label}


def _reference_enums(reports: list[DecodedReport]) -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for r in reports:
        for table, values in r.enums.items():
            out.setdefault(table, values)
    return out


def _session(reports: list[DecodedReport], clock: ClockPlan) -> tuple[int, int] | None:
    spans = [(r.session[0] + clock.offset_of(i), r.session[1] + clock.offset_of(i))
             for i, r in enumerate(reports) if r.session is not None]
    return (min(s[0] for s in spans), max(s[1] for s in spans)) if len(spans) == len(reports) else None


def _info(reports: list[DecodedReport], session) -> ReportInfo:
    first = reports[0].info
    types = [r.info.capture_event_types for r in reports]
    return ReportInfo(path=first.path, nsys_version=first.nsys_version, schema_version=first.schema_version,
                      tables=set().union(*(r.info.tables for r in reports)),
                      capture_event_types=None if any(t is None for t in types) else set().union(*types),
                      session=session)


def _columns(reports: list[DecodedReport]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in reports:
        for table, cols in r.columns.items():
            out.setdefault(table, set()).update(cols)
    return out


def _cores(reports: list[DecodedReport]) -> int | None:
    """The smallest machine's cores: loader advice must fit every rank's host."""
    cores = [r.cpu_cores for r in reports if r.cpu_cores]
    return min(cores) if cores else None
