"""Data-loader stalls: how long the training thread waits for batches, and whether workers can keep up.

Waits come from nvtx_autotrace's ``dataloader.next [loader]`` ranges or from
user ranges matching ``--loader-pattern``. Worker fetch times come from the
``dataloader.fetch [loader] worker N`` ranges each worker process emits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.measures.gpu_idle import loader_wait_mask
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import name_mask


@dataclass
class LoaderResult:
    waits: pd.DataFrame  # loader, start_ns, end_ns, duration_ns, pid, gtid
    loaders: pd.DataFrame  # loader, waits, wait_ns, wait_ns_median, wait_ns_max, workers, fetches, fetch_ns_median
    workers: pd.DataFrame  # loader, worker, pid, fetches, fetch_ns_total, fetch_ns_median, batches_per_s
    restarts: dict[str, int]  # loader -> worker processes beyond one set (workers re-created each epoch)
    fetches: pd.DataFrame | None = None  # loader, worker, pid, start_ns, end_ns, duration_ns: one row per batch

    @property
    def wait_set(self) -> iv.Set:
        return iv.union(self.waits["start_ns"].to_numpy(), self.waits["end_ns"].to_numpy())


def analyze_loader(ranges: pd.DataFrame, user_pattern: str) -> LoaderResult | None:
    if not len(ranges):
        return None
    wait_rows = ranges[loader_wait_mask(ranges["name"], user_pattern)]
    fetch_match = {c: names.WORKER_FETCH_RE.match(c) for c in ranges["name"].cat.categories}
    fetch_rows = ranges[name_mask(ranges["name"], fetch_match.get)]
    if not len(wait_rows) and not len(fetch_rows):
        return None

    def loader_of(name: str) -> str:
        m = names.LOADER_WAIT_RE.match(name)
        return m.group("loader") if m else name

    waits = pd.DataFrame({
        "loader": [loader_of(str(n)) for n in wait_rows["name"]],
        "start_ns": wait_rows["start_ns"].to_numpy(), "end_ns": wait_rows["end_ns"].to_numpy(),
        "pid": wait_rows["pid"].to_numpy(), "gtid": wait_rows["gtid"].to_numpy(),
    })
    waits["duration_ns"] = waits["end_ns"] - waits["start_ns"]
    waits = waits.sort_values("start_ns", ignore_index=True)
    marks = _cpu_marks(ranges)
    waits["cpu_ns"] = _cpu_within(marks, waits)  # num_workers=0: the loop loads the batch itself, in its wait

    fetches = pd.DataFrame({
        "loader": [fetch_match[str(n)].group("loader") for n in fetch_rows["name"]],
        "worker": [int(fetch_match[str(n)].group("worker")) for n in fetch_rows["name"]],
        "pid": fetch_rows["pid"].to_numpy(),
        "start_ns": fetch_rows["start_ns"].to_numpy(), "end_ns": fetch_rows["end_ns"].to_numpy(),
    })
    fetches["duration_ns"] = fetches["end_ns"] - fetches["start_ns"]
    fetches["gtid"] = fetch_rows["gtid"].to_numpy()
    fetches["cpu_ns"] = _cpu_within(marks, fetches)
    fetches = fetches.drop(columns=["gtid"])
    workers = (fetches.groupby(["loader", "worker", "pid"], as_index=False)
               .agg(fetches=("duration_ns", "size"), fetch_ns_total=("duration_ns", "sum"),
                    fetch_ns_median=("duration_ns", "median"), first=("start_ns", "min"), last=("end_ns", "max")))
    active = (workers["last"] - workers["first"]).clip(lower=1)
    workers["batches_per_s"] = workers["fetches"] / (active / 1e9)
    workers = workers.drop(columns=["first", "last"])
    workers["fetch_ns_median"] = workers["fetch_ns_median"].astype(np.int64)

    rows = []
    for loader in sorted(set(waits["loader"]) | set(fetches["loader"])):
        w = waits[waits["loader"] == loader]["duration_ns"]
        f = fetches[fetches["loader"] == loader]
        rows.append({
            "loader": loader, "waits": int(len(w)), "wait_ns": int(w.sum()),
            "wait_ns_median": int(w.median()) if len(w) else 0, "wait_ns_max": int(w.max()) if len(w) else 0,
            "workers": int(f["worker"].nunique()), "fetches": int(len(f)),
            "fetch_ns_median": int(f["duration_ns"].median()) if len(f) else 0,
            "fetch_cpu_share": _cpu_share(f) if len(f) else _cpu_share(waits[waits["loader"] == loader]),
            "fetch_cpu_threads": None if len(f) else _cpu_share(waits[waits["loader"] == loader], clip=False),
        })
    loaders = pd.DataFrame(rows)
    restarts = {}
    for loader, f in fetches.groupby("loader"):
        # Each training process (DDP rank) has its own workers: one set per process that waits on this loader.
        sets = max(1, waits.loc[waits["loader"] == loader, "pid"].nunique())
        extra = f["pid"].nunique() - sets * f["worker"].nunique()
        if extra > 0:
            restarts[str(loader)] = int(extra)
    return LoaderResult(waits=waits, loaders=loaders, workers=workers, restarts=restarts, fetches=fetches)


def _cpu_marks(ranges: pd.DataFrame) -> pd.DataFrame:
    """The ``dataloader.cpu N us`` ranges nvtx_autotrace opens at the end of each batch load, inside it."""
    cpu_match = {c: names.WORKER_CPU_RE.match(c) for c in ranges["name"].cat.categories}
    rows = ranges[name_mask(ranges["name"], cpu_match.get)]
    return pd.DataFrame({"gtid": rows["gtid"].to_numpy(), "start_ns": rows["start_ns"].to_numpy(),
                         "cpu_ns": [int(cpu_match[str(n)].group("us")) * 1000 for n in rows["name"]]})


def _cpu_within(marks: pd.DataFrame, loads: pd.DataFrame) -> np.ndarray:
    """Each load's (a worker's fetch, or a wait in which the loop loaded the batch itself) CPU time: the mark on
    the same thread that starts inside it; NaN where there is none (an older capture, user ranges)."""
    out = np.full(len(loads), np.nan)
    if not len(marks) or not len(loads):
        return out
    f = pd.DataFrame({"gtid": loads["gtid"].to_numpy(), "start_ns": loads["start_ns"].to_numpy(),
                      "end_ns": loads["end_ns"].to_numpy(), "row": np.arange(len(loads))})
    joined = pd.merge_asof(marks.sort_values("start_ns"), f.sort_values("start_ns"), on="start_ns", by="gtid",
                           direction="backward")
    joined = joined[joined["row"].notna() & (joined["start_ns"] <= joined["end_ns"])]
    out[joined["row"].astype(np.int64).to_numpy()] = joined["cpu_ns"].to_numpy(dtype=float)
    return out


def _cpu_share(f: pd.DataFrame, clip: bool = True) -> float | None:
    """The share of a fetch's wall time its worker needed a CPU for (decoding: near 1; reading from a network file
    system or sleeping: near 0): the median over fetches, as a few long ones (a worker's first, its start-up and
    imports; a stall) would sway a ratio of sums (busy workers on the loaded 2-core VM: 0.26 by sums); None without
    CPU times. ``clip=False``: a load in the main process counts the CPU time torch's other threads spent on it
    (nvtx_autotrace), so the ratio exceeds 1 where they shared it: how many cores' worth one worker must do alone."""
    timed = f[f["cpu_ns"].notna() & (f["duration_ns"] > 0)]
    if not len(timed):
        return None
    ratios = timed["cpu_ns"].to_numpy(dtype=float) / timed["duration_ns"].to_numpy(dtype=float)
    return round(float(np.median(ratios.clip(0.0, 1.0) if clip else np.maximum(ratios, 0.0))), 4)


@dataclass
class Pace:
    """How fast a loader's workers can deliver batches for good: no step that eats one batch is shorter."""

    loader: str
    workers: int  # per training process
    fetch_ns: float  # a worker's time per batch: with several ranks, the slowest rank's workers' (all wait for it)
    slowest_rank: bool
    cpu_share: float | None = None  # of a fetch's time, the share its worker is on a CPU (None: not recorded)

    @property
    def interval_ns(self) -> float:
        return self.fetch_ns / self.workers

    def words(self) -> str:
        whose = " of the slowest rank" if self.slowest_rank else ""
        deliver = "delivers" if self.workers == 1 else "deliver"
        return (f"{self.workers} worker{'' if self.workers == 1 else 's'}{whose} at {self.fetch_ns / 1e6:.2f} ms "
                f"per batch {deliver} one every {self.interval_ns / 1e6:.2f} ms")


def pace(analysis) -> Pace | None:
    """The delivery pace of the loader the training loop waits on most; None without worker fetch ranges."""
    if analysis.loader is None or not len(analysis.loader.loaders) or not len(analysis.loader.waits):
        return None
    top = analysis.loader.loaders.sort_values("wait_ns", ascending=False).iloc[0]
    have = int(top["workers"])
    if not have or not int(top["fetches"]):
        return None
    mine = analysis.loader.workers[analysis.loader.workers["loader"] == top["loader"]]
    share = top.get("fetch_cpu_share")
    share = None if share is None or share != share else float(share)
    if training_processes(analysis) < 2 or not len(mine):
        return Pace(str(top["loader"]), have, float(top["fetch_ns_median"]), False, share)
    # each rank has its own `have` workers; the slowest set's typical time per batch
    slowest = np.sort(mine["fetch_ns_median"].to_numpy())[-have:]
    return Pace(str(top["loader"]), have, float(np.median(slowest)), True, share)


def taken_and_delivered(analysis, loader: str, window: tuple[int, int]) -> tuple[int, int]:
    """Batches the training loop took from ``loader`` in the window (all ranks), and batches its workers
    finished in it: more taken than delivered means the loop ate a queue filled before the window."""
    lo, hi = window
    waits = analysis.loader.waits[analysis.loader.waits["loader"] == loader]
    taken = int(((waits["start_ns"] >= lo) & (waits["start_ns"] < hi)).sum())
    f = analysis.loader.fetches
    if f is None:
        return taken, 0
    f = f[f["loader"] == loader]
    return taken, int(((f["end_ns"] >= lo) & (f["end_ns"] < hi)).sum())


def training_processes(analysis) -> int:
    """Training processes on this machine, each with its own loader workers (DDP ranks)."""
    pids = set(analysis.loader.waits["pid"]) if analysis.loader is not None and len(analysis.loader.waits) else set()
    return max(1, len(pids))


def processes_per_host(analysis) -> tuple[int, int]:
    """(the most training processes that share one host, how many hosts): reports that name different hosts
    (one per node) give each host's ranks its own cores; a process of an unnamed host is counted with every
    unnamed one, as if they shared a machine (advice then errs on the side of fewer workers)."""
    pids = set(analysis.loader.waits["pid"]) if analysis.loader is not None and len(analysis.loader.waits) else set()
    hosts = [analysis.pid_hosts.get(int(p)) for p in pids]
    per_host = {h: hosts.count(h) for h in set(hosts)}
    return max(per_host.values(), default=1), max(1, len(per_host))


MAX_WAITING_WORKERS = 64  # workers that mostly wait (storage, network) need no core each, but each is a process


def usable_workers(analysis, cpu_share: float | None = None) -> int | None:
    """Loader workers a training process can have without oversubscribing its host's CPU cores (one core
    per rank for the training loop itself); None when the report does not say how many cores there are.
    Workers busy on a CPU only ``cpu_share`` of a fetch (the rest waiting) take that share of a core each."""
    if not analysis.cpu_cores:
        return None
    cores = max(1, analysis.cpu_cores // processes_per_host(analysis)[0] - 1)
    if not cpu_share or cpu_share >= 1:
        return cores
    return max(cores, min(MAX_WAITING_WORKERS, int(cores / cpu_share)))


# A worker's time per batch grows by this share as the busy processes on the host (workers, counted by the
# share of the time they are busy, and each training loop) grow by as many as it has cores: CPU-bound workers
# share caches, memory bandwidth and the all-core clock. Measured, as that growth per full host: 0.44-0.51
# (ResNet-18 ImageNet transforms, a 16-core H100 host: 310.6, 369.8, 413.2 ms per batch at 2, 8, 14 workers,
# device phase K2), 0.59 (the public ImageNet example, ResNet-18, 16 cores: 596 -> 854 ms at 2 -> 14), 0.09
# (ResNet-50, another 16-core H100 host: 438 -> 449 ms at 2 -> 8), at most 0.2 (a DDP pair on a 32-core H200
# host: 4 -> 15 workers a rank). Hosts differ by that much; 0.3 keeps each within 15 % of its fetch time.
CONTENTION = 0.3


def contended_fetch_ns(fetch_ns: float, have: int, workers: int, cores: int | None, ranks: int = 1,
                       compute_ns: float | None = None, cpu_share: float | None = None) -> float:
    """A worker's time per batch once ``workers`` workers per training process run where ``have`` ran (fetch
    time measured with ``have``, each busy all the time); ``ranks`` training processes share the ``cores``.
    With ``compute_ns`` (a step without waits), workers that outpace the loop idle part of the time; with
    ``cpu_share``, a worker is on a CPU only that share of a fetch (it waits the rest)."""
    if not cores or workers <= have:
        return fetch_ns
    on_cpu = min(1.0, cpu_share) if cpu_share else 1.0

    def busy(n: int, per_batch: float) -> float:  # busy workers and the training loop, all processes
        share = min(float(n), per_batch / compute_ns) if compute_ns else float(n)
        return min(ranks * (share * on_cpu + 1), cores)

    after = fetch_ns
    for _ in range(8):  # busier workers are slower, and slower ones are busy more of the time
        after = fetch_ns * (1 + CONTENTION * max(0.0, busy(workers, after) - busy(have, 1e30)) / cores)
    return after


def workers_needed(fetch_ns_median: float, compute_ns_per_step: float, have: int | None = None,
                   cores: int | None = None, ranks: int = 1, cpu_share: float | None = None) -> int:
    """Workers that keep the queue full: each delivers one batch per fetch time, the loop eats one per step;
    with ``have`` and ``cores``, each added worker slows every worker (contended_fetch_ns)."""
    if compute_ns_per_step <= 0 or fetch_ns_median <= 0:
        return 0
    need = int(np.ceil(1.2 * fetch_ns_median / compute_ns_per_step))
    if not cores or have is None:
        return need
    while need < 4 * cores and 1.2 * contended_fetch_ns(fetch_ns_median, have, need, cores, ranks,
                                                         compute_ns_per_step, cpu_share) / need > compute_ns_per_step:
        need += 1
    return need
