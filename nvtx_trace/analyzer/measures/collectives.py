"""Communication kernels, and the waiting hidden inside them.

A GPU running an NCCL all-reduce counts as busy, but in a multi-GPU job most of that time is
often spent spinning until the slowest rank arrives: waiting, not work. Per GPU this splits
the steady window's kernel time into compute and communication, and each collective's time
into transfer and wait: collectives are matched across GPUs by their order within each kind
(every rank issues the same collectives in the same order), the shortest duration among the
GPUs is the transfer, and what a GPU spends beyond it is waiting for the last rank to arrive.
The GPU that waits least is the one the others wait for: the straggler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms, pct

COMM_KERNEL_RE = re.compile(r"^(nccl|ncclDevKernel|ncclKernel|rccl|gloo|c10d)", re.I)
# the collective a kernel runs, across NCCL versions' names (ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_AllGather_RING_LL): ranks are paired within each kind, so that an all-gather on one stream
# and an all-reduce on another, started in either order, never pair with each other
OP_RE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|AllToAll|SendRecv|Reduce|Send|Recv)", re.I)
PAIRED_ENDS_NS = 200_000  # one collective ends within µs on every rank (one clock); pairs farther apart are wrong
ENDS_TOGETHER = frozenset({"allreduce", "allgather", "reducescatter", "alltoall"})  # a broadcast's root leaves early
ALONE_SHARE = 0.1  # one rank's GPU in collectives this much of the window: say its busy time may be waiting
ALONE_PREFIX = "one rank's collectives:"  # the warning's first words (the "no findings" lines refer to it)


@dataclass
class DeviceComm:
    device_id: int
    pid: int
    compute_ns: int  # kernels other than communication, union, in the window
    communication_ns: int  # communication kernels, union, in the window
    overlap_ns: int  # both at once (compute hidden behind communication)
    wait_ns: int | None  # communication time beyond the fastest rank's, same collectives: waiting for a peer
    collectives: int
    last_arrivals: int | None = 0  # collectives in which this GPU waited least: it arrived last, the others waited
    caused_wait_ns: int | None = 0  # the others' waiting in those collectives: the wait this GPU's lateness caused


@dataclass
class CommResult:
    devices: list[DeviceComm] = field(default_factory=list)
    matched: bool | None = True  # every GPU issued the same number of collectives (else matched up to the fewest)
    # per process: when its GPU spun waiting for a peer with no other kernel running (each collective's wait is
    # its first part; the transfer, the fastest rank's time, ends it); per-step figures measure their steps in it
    wait_sets: dict[int, iv.Set] = field(default_factory=dict)
    # per process: its collectives with no partner on another GPU (their waiting is unknown; steps holding one
    # are left out of per-step figures); per GPU: how many of them start in the window
    unpaired_sets: dict[int, iv.Set] = field(default_factory=dict)
    unpaired: dict[int, int] = field(default_factory=dict)

    def pairing_warning(self, every_step: bool = False) -> str | None:
        """Collectives left without a partner: a capture that began or ended at a different collective, or a
        rank that issued collectives the others did not. ``every_step``: every steady step holds one."""
        left = {dev: n for dev, n in self.unpaired.items() if n}
        if not left:
            return None
        which = ", ".join(f"GPU {dev}: {n} of its {next(d.collectives for d in self.devices if d.device_id == dev)}"
                          for dev, n in sorted(left.items()))
        steps = ("every steady step holds one, so per-step compute counts their waiting as work" if every_step else
                 "per-step compute leaves out the steps that hold them")
        return (f"collectives without a partner on the other GPUs in the window ({which}): their waiting is not "
                f"measured, and {steps} (captures that began or ended at different collectives, or ranks that "
                "issued different ones)")

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([vars(d) for d in self.devices])

    @property
    def alone(self) -> bool:
        """One GPU's collectives without its peers' (one rank's report): waiting cannot be told from transfer."""
        return len(self.devices) == 1


def analyze_collectives(gpu_ops: pd.DataFrame, kernel_names: dict[int, str], window: tuple[int, int]) \
        -> CommResult | None:
    """None unless a GPU ran communication kernels; with one such GPU, its split without the waits."""
    kernels = gpu_ops[gpu_ops["kind"] == 0]
    comm_ids = [i for i, n in kernel_names.items() if COMM_KERNEL_RE.match(n or "")]
    if not comm_ids or not len(kernels):
        return None
    is_comm = kernels["name_id"].isin(comm_ids).to_numpy()
    devices = sorted(int(d) for d in pd.unique(kernels["device_id"][is_comm]))
    if not devices:
        return None
    w0, w1 = window
    on_dev = {dev: (kernels["device_id"] == dev).to_numpy() for dev in devices}
    per_dev = {dev: kernels[on & is_comm].sort_values("start_ns") for dev, on in on_dev.items()}
    out = CommResult(matched=None)
    computing = kernels[~is_comm]  # a process driving several GPUs spins only while none of them computes
    compute_sets = {int(pid): iv.union(k["start_ns"].to_numpy(), k["end_ns"].to_numpy())
                    for pid, k in computing.groupby("pid")}
    for dev in devices:
        comm, other = per_dev[dev], kernels[on_dev[dev] & ~is_comm]
        c_set = iv.union(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
        k_set = iv.union(other["start_ns"].to_numpy(), other["end_ns"].to_numpy())
        c_ns = int(iv.Coverage(c_set).measure(w0, w1))
        k_ns = int(iv.Coverage(k_set).measure(w0, w1))
        both = int(iv.Coverage(iv.merge(c_set, k_set)).measure(w0, w1))
        starts = comm["start_ns"].to_numpy()
        pids = pd.unique(comm["pid"])
        out.devices.append(DeviceComm(device_id=dev, pid=int(pids[0]) if len(pids) else -1, compute_ns=k_ns,
                                      communication_ns=c_ns, overlap_ns=max(0, c_ns + k_ns - both), wait_ns=None,
                                      collectives=int(((starts >= w0) & (starts < w1)).sum()),
                                      last_arrivals=None, caused_wait_ns=None))
    if len(devices) > 1:
        ops = {i: _op(kernel_names.get(i)) for i in comm_ids}
        _waits(out, [per_dev[dev].assign(op=per_dev[dev]["name_id"].map(ops)) for dev in devices], compute_sets,
               window)
    return out


def _op(name: str | None) -> str:
    found = OP_RE.search(name or "")
    return found.group(1).lower() if found else (name or "")


def _lag(ref_ends: np.ndarray, ends: np.ndarray) -> tuple[int, float]:
    """On one clock every rank's copy of a collective ends at about the same time (all finish once the last
    arrives): the shift of the order that pairs each first collective with the one ending nearest it, or
    none, whichever brings the ends closest; with the median distance of the paired ends."""
    if not len(ref_ends) or not len(ends):
        return 0, 0.0
    fits = []
    for lag in {0, int(np.argmin(np.abs(ref_ends - ends[0]))), -int(np.argmin(np.abs(ends - ref_ends[0])))}:
        a, b = (ref_ends[lag:], ends) if lag >= 0 else (ref_ends, ends[-lag:])
        n = min(len(a), len(b))
        fits.append((float(np.median(np.abs(a[:n] - b[:n]))), abs(lag), lag))
    apart, _, lag = min(fits)  # the closest ends; on a tie, the smaller shift
    return lag, apart


def _pairs(per_dev: list[pd.DataFrame]) -> list[np.ndarray]:
    """Per GPU, the rows of its collectives in pairing order: within each kind of collective by issue order,
    shifted where a capture began late; a collective with no partner on every GPU is left out, and so is a
    kind that every rank leaves at once whose paired ends lie farther apart than one collective's can."""
    rows: list[list[np.ndarray]] = [[] for _ in per_dev]
    for op in sorted(set().union(*(set(c["op"]) for c in per_dev))):
        idx = [np.flatnonzero((c["op"] == op).to_numpy()) for c in per_dev]
        ends = [c["end_ns"].to_numpy()[i] for c, i in zip(per_dev, idx)]
        ref = max(range(len(idx)), key=lambda r: len(idx[r]))
        fits = [(0, 0.0) if r == ref else _lag(ends[ref], ends[r]) for r in range(len(idx))]
        if op in ENDS_TOGETHER and any(apart > PAIRED_ENDS_NS for _, apart in fits):
            continue
        lags = [lag for lag, _ in fits]
        common = np.arange(max(lags + [0]), min(len(i) + lag for i, lag in zip(idx, lags)))
        for r, (i, lag) in enumerate(zip(idx, lags)):
            rows[r].append(i[common - lag])
    return [np.concatenate(r) if r else np.empty(0, np.int64) for r in rows]


def _waits(out: CommResult, per_dev: list[pd.DataFrame], compute_sets: dict[int, iv.Set],
           window: tuple[int, int]) -> None:
    """Each GPU's waiting: in each paired collective, the time beyond the fastest GPU's."""
    w0, w1 = window
    paired = _pairs(per_dev)
    out.matched = all(len(p) == len(c) for p, c in zip(paired, per_dev))
    if not len(paired[0]):  # nothing pairs: waiting cannot be told from transfer on any GPU
        for d, comm in zip(out.devices, per_dev):
            d.wait_ns = d.last_arrivals = d.caused_wait_ns = None
            out.unpaired_sets[d.pid] = iv.union(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
            out.unpaired[d.device_id] = d.collectives
        return
    durations = np.stack([(c["end_ns"].to_numpy() - c["start_ns"].to_numpy())[p] for c, p in zip(per_dev, paired)])
    waits = durations - durations.min(axis=0)  # beyond the fastest rank's time in the same collective
    last = durations.argmin(axis=0)  # who arrived last at each collective (the others spun waiting for it)
    total_wait = waits.sum(axis=0)
    for row, (d, comm) in enumerate(zip(out.devices, per_dev)):
        starts = comm["start_ns"].to_numpy()[paired[row]]
        spinning = iv.subtract(iv.union(starts, starts + waits[row]), compute_sets.get(d.pid, iv.empty()))
        out.wait_sets[d.pid] = iv.merge(out.wait_sets.get(d.pid, iv.empty()), spinning)
        alone = np.ones(len(comm), bool)
        alone[paired[row]] = False
        lone = comm[alone]
        out.unpaired_sets[d.pid] = iv.merge(out.unpaired_sets.get(d.pid, iv.empty()),
                                            iv.union(lone["start_ns"].to_numpy(), lone["end_ns"].to_numpy()))
        out.unpaired[d.device_id] = int(((lone["start_ns"] >= w0) & (lone["start_ns"] < w1)).sum())
        inside = (starts >= w0) & (starts < w1)
        d.wait_ns = int(waits[row][inside].sum())
        d.last_arrivals = int(((last == row) & inside).sum())
        d.caused_wait_ns = int(total_wait[(last == row) & inside].sum())


def alone_warning(comm: CommResult | None, window: tuple[int, int], reports: int = 1,
                  other_kernels: bool = False) -> str | None:
    """A report whose only communicating GPU spends much of the window in collectives: with no peer's report,
    its waiting for the other ranks counts as busy and no straggler can be named. ``reports``: how many
    rank reports were merged; ``other_kernels``: whether other GPUs in the analysis ran kernels at all."""
    if comm is None or not comm.alone or window[1] <= window[0]:
        return None
    d = comm.devices[0]
    share = d.communication_ns / (window[1] - window[0])
    if share < ALONE_SHARE:
        return None
    head = (f"{ALONE_PREFIX} GPU {d.device_id} spends {pct(share)} of the window ({ms(d.communication_ns)}) inside "
            "communication kernels")
    if other_kernels:
        return (head + "; the other GPUs here ran no communication kernels (ranks of another job, or captured "
                "without them?): waiting there for slower ranks cannot be told from transfer and counts as busy")
    if reports > 1:
        others = ("the other report holds no" if reports == 2 else f"none of the other {reports - 1} reports holds")
        return (head + f", and {others} GPU kernels (captured without CUDA tracing? nsys -t cuda,nvtx): "
                "waiting there for slower ranks cannot be told from transfer and counts as busy")
    return (head + ", and this report holds no other rank's GPU: waiting there for slower ranks cannot be told "
            "from transfer and counts as busy; analyze every rank's report together "
            "(nvtx-trace analyze rank0.sqlite rank1.sqlite ..., or their folder)")
