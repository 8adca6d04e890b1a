"""GPU busy time, idle gaps, and what the CPU was doing during each gap.

Busy = union of kernel, memcpy and memset intervals over every stream and
process on a device (never a per-stream sum, which overstates headroom).
Span = first op start to last op end. Gaps = holes of at least ``min_gap_ns``.

Each gap's time is split among causes in priority order, each cause taking
only what the ones before it left (so shares add up to 100 %)::

    GPU      ====)                 (=====        gap = 8 units
    CPU main     [  dataloader.next  ][fwd]      dataloader 6, forward 2
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import COPY_API_RE, SLOW_API_NS, SYNC_API_RE, Trace, name_mask
from nvtx_trace.labels import IDLE_CAUSES as CAUSES  # the causes, in the order they claim gap time

SYNC_DRAIN_SLACK_NS = 50_000  # a gap starting this soon after a sync returned was caused by it
OPTIMIZER_RE = re.compile(r"(?i)^optimizer|\boptim|zero_grad|\bsgd\b|\badam")
FORWARD_RE = re.compile(r"(?i)^forward\b|\bforward$|\bfwd\b")
BACKWARD_RE = re.compile(r"(?i)^backward\b|\bbackward$|\bbwd\b")


@dataclass
class DeviceIdle:
    device_id: int
    name: str
    pids: list[int]
    span_start_ns: int
    span_end_ns: int
    busy_ns: int
    gap_count: int
    gap_idle_ns: int
    busy: iv.Set = field(repr=False)

    @property
    def span_ns(self) -> int:
        return self.span_end_ns - self.span_start_ns

    @property
    def utilization(self) -> float:
        return self.busy_ns / self.span_ns if self.span_ns > 0 else 0.0

    def busy_share(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The share of each interval [starts, ends) the GPU was busy (the timeline's bins: a page draws it)."""
        return iv.Coverage(self.busy).measure(starts, ends) / np.maximum(ends - starts, 1)


@dataclass
class IdleResult:
    devices: list[DeviceIdle]
    gaps: pd.DataFrame  # device_id, start_ns, end_ns, duration_ns, cause, <cause>_ns...
    causes: pd.DataFrame  # whole trace: device_id, cause, label, idle_ns, share, gaps (dominant)


def loader_wait_mask(range_names: pd.Series, user_pattern: str) -> np.ndarray:
    """Ranges that mean "waiting for the next batch": auto ``dataloader.next [..]`` or a user name."""
    user = re.compile(user_pattern)
    return name_mask(range_names, lambda c: names.LOADER_WAIT_RE.match(c) or user.search(c))


def category_masks(range_names: pd.Series, user_loader_pattern: str) -> dict[str, np.ndarray]:
    """Which NVTX ranges count for which cause (step ranges are containers, never a cause)."""
    def by(pred) -> np.ndarray:
        return name_mask(range_names, pred)

    is_step = by(lambda c: names.STEP_RE.match(c))
    loader = loader_wait_mask(range_names, user_loader_pattern)
    sync = by(lambda c: names.SYNC_RE.match(c))
    copy = by(lambda c: c.startswith((names.H2D_COPY_PREFIX, names.PIN_MEMORY_PREFIX)))
    # a closure run inside optimizer.step computes forward, loss and backward: the forward's, not the optimizer's
    closure = by(lambda c: c.startswith(names.OPTIMIZER_CLOSURE_PREFIX))
    optimizer = by(lambda c: OPTIMIZER_RE.search(c)) & ~closure
    backward = by(lambda c: BACKWARD_RE.search(c)) & ~optimizer & ~closure
    forward = (by(lambda c: FORWARD_RE.search(c)) | closure) & ~optimizer & ~backward
    claimed = is_step | loader | sync | copy | optimizer | backward | forward
    return {"dataloader": loader, "sync": sync, "copy": copy, "optimizer": optimizer, "backward": backward,
            "forward": forward, "other_range": ~claimed, "closure": closure}


def range_categories(range_names: pd.Series, user_loader_pattern: str) -> dict[str, str]:
    """Each NVTX range name's colour key in the timeline: the gap cause it stands for (with the user's loader
    pattern, as the analysis counts it), 'step', or 'other_range'."""
    unique = pd.Series(pd.unique(range_names.astype(str)), dtype="object")
    masks = category_masks(unique.astype("category"), user_loader_pattern)
    out = np.full(len(unique), "other_range", dtype=object)
    for key in ("forward", "backward", "optimizer", "copy", "sync", "dataloader"):
        out[masks[key]] = key
    out[unique.map(lambda c: bool(names.STEP_RE.match(c))).to_numpy(bool)] = "step"
    out[unique.map(lambda c: bool(names.WORKER_FETCH_RE.match(c))).to_numpy(bool)] = "dataloader"
    return dict(zip(unique, out))


def analyze_idle(trace: Trace, min_gap_ns: int, user_loader_pattern: str) -> IdleResult:
    ops = trace.gpu_ops
    devices: list[DeviceIdle] = []
    gap_frames = []
    ranges = trace.ranges
    masks = category_masks(ranges["name"], user_loader_pattern) if len(ranges) else {}
    syncs = trace.api_calls(SYNC_API_RE)
    copies = trace.api_calls(COPY_API_RE)
    slow_api = trace.api_calls(None, min_duration_ns=SLOW_API_NS)
    for device_id, dev_ops in ops.groupby("device_id", sort=True):
        busy = iv.union(dev_ops["start_ns"].to_numpy(), dev_ops["end_ns"].to_numpy())
        pids = sorted(int(p) for p in dev_ops["pid"].unique())
        gaps = iv.holes(busy, min_len=min_gap_ns)
        dev = DeviceIdle(
            device_id=int(device_id), name=trace.gpu_names.get(int(device_id), f"GPU {device_id}"), pids=pids,
            span_start_ns=int(busy[0][0]), span_end_ns=int(busy[1][-1]), busy_ns=iv.total(busy),
            gap_count=int(gaps[0].size), gap_idle_ns=iv.total(gaps), busy=busy,
        )
        devices.append(dev)

        def in_pids(df, pids=pids):
            return df[df["pid"].isin(pids)]

        cause_sets = _cause_sets(gaps, in_pids(ranges), {k: m[ranges["pid"].isin(pids).to_numpy()] for k, m in masks.items()},
                                 in_pids(syncs), in_pids(copies), in_pids(slow_api))
        frame = _split_gaps(int(device_id), gaps, cause_sets)
        gap_frames.append(frame)
    cols = ["device_id", "start_ns", "end_ns", "duration_ns", "cause"] + [f"{c}_ns" for c in CAUSES]
    gaps_df = pd.concat(gap_frames, ignore_index=True) if gap_frames else pd.DataFrame(columns=cols)
    causes_df = summarize_causes(gaps_df)
    return IdleResult(devices=devices, gaps=gaps_df, causes=causes_df)


def _cause_sets(gaps: iv.Set, ranges, masks, syncs, copies, slow_api) -> dict[str, iv.Set]:
    """Each cause's time inside the gaps, after higher-priority causes took theirs."""
    gap_set = gaps

    def from_df(df, mask=None) -> iv.Set:
        if mask is not None:
            df = df[mask]
        return iv.union(df["start_ns"].to_numpy(), df["end_ns"].to_numpy()) if len(df) else iv.empty()

    raw: dict[str, iv.Set] = {}
    raw["dataloader"] = from_df(ranges, masks.get("dataloader")) if len(ranges) else iv.empty()
    # A sync that was still blocking (or just returned) when the GPU ran dry explains the whole gap.
    drained = iv.empty()
    if len(syncs) and gaps[0].size:
        s, e = syncs["start_ns"].to_numpy(), syncs["end_ns"].to_numpy() + SYNC_DRAIN_SLACK_NS
        sync_cov = iv.Coverage(iv.union(s, e))
        hit = sync_cov.measure(gaps[0] - 1, gaps[0]) > 0
        drained = (gaps[0][hit], gaps[1][hit])
    sync_ranges = from_df(ranges, masks.get("sync")) if len(ranges) else iv.empty()
    raw["sync"] = iv.merge(iv.merge(from_df(syncs), sync_ranges), drained)
    raw["copy"] = iv.merge(from_df(copies), from_df(ranges, masks.get("copy")) if len(ranges) else iv.empty())
    raw["cuda_api"] = from_df(slow_api)
    for key in ("optimizer", "backward", "forward", "other_range"):
        raw[key] = from_df(ranges, masks.get(key)) if len(ranges) else iv.empty()
    if len(ranges) and masks.get("closure") is not None and masks["closure"].any():  # step(closure): not the optimizer
        raw["optimizer"] = iv.subtract(raw["optimizer"], from_df(ranges, masks["closure"]))
    claimed = iv.empty()
    out = {}
    for key in CAUSES:
        if key == "unattributed":
            out[key] = iv.subtract(gap_set, claimed)
            continue
        mine = iv.subtract(iv.intersect(raw[key], gap_set), claimed)
        out[key] = mine
        claimed = iv.merge(claimed, mine)
    return out


def _split_gaps(device_id: int, gaps: iv.Set, cause_sets: dict[str, iv.Set]) -> pd.DataFrame:
    frame = pd.DataFrame({"device_id": device_id, "start_ns": gaps[0], "end_ns": gaps[1],
                          "duration_ns": gaps[1] - gaps[0]})
    for key, cset in cause_sets.items():
        frame[f"{key}_ns"] = iv.Coverage(cset).measure(gaps[0], gaps[1])
    per_cause = frame[[f"{k}_ns" for k in CAUSES]].to_numpy()
    keys = np.array(list(CAUSES))
    frame["cause"] = keys[per_cause.argmax(axis=1)] if len(frame) else np.empty(0, dtype=object)
    return frame


def gaps_in(gaps: pd.DataFrame, window: tuple[int, int]) -> pd.DataFrame:
    """The gaps that start inside the window: a gap belongs to the step in which the GPU ran dry."""
    return gaps[(gaps["start_ns"] >= window[0]) & (gaps["start_ns"] < window[1])]


def summarize_causes(gaps: pd.DataFrame, window: tuple[int, int] | None = None) -> pd.DataFrame:
    """Idle time per cause over the gaps that start inside ``window`` (all gaps when None)."""
    if window is not None:
        gaps = gaps_in(gaps, window)
    rows = []
    for device_id, dev in gaps.groupby("device_id", sort=True):
        dev_total = int(dev["duration_ns"].sum())
        for key, label in CAUSES.items():
            idle = int(dev[f"{key}_ns"].sum())
            if idle:
                rows.append({"device_id": int(device_id), "cause": key, "label": label, "idle_ns": idle,
                             "share": idle / dev_total if dev_total else 0.0, "gaps": int((dev["cause"] == key).sum())})
    causes = pd.DataFrame(rows, columns=["device_id", "cause", "label", "idle_ns", "share", "gaps"])
    return causes.sort_values(["device_id", "idle_ns"], ascending=[True, False], ignore_index=True)


def describe_gaps(trace: Trace, idle: IdleResult, window: tuple[int, int], top: int = 10) -> pd.DataFrame:
    """What each CPU thread of the GPU's processes was doing during the largest gaps of the window.

    One row per (gap, thread): the innermost NVTX range open at the gap's midpoint, and
    slow CUDA API calls overlapping the gap.
    """
    frames = []
    gaps = gaps_in(idle.gaps, window)
    slow_api = trace.api_calls(None, min_duration_ns=SLOW_API_NS)
    for dev in idle.devices:
        largest = gaps[gaps["device_id"] == dev.device_id].nlargest(top, "duration_ns")
        ranges = trace.ranges[trace.ranges["pid"].isin(dev.pids)]
        frames.append(_open_ranges(trace, dev.device_id, largest, ranges, slow_api[slow_api["pid"].isin(dev.pids)]))
    cols = ["device_id", "gap_start_ns", "gap_ns", "cause", "thread", "what", "name", "overlap_ns"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _open_ranges(trace: Trace, device_id: int, top: pd.DataFrame, ranges: pd.DataFrame,
                 slow_api: pd.DataFrame) -> pd.DataFrame:
    rows = []
    if not len(top):
        return pd.DataFrame(rows)
    mids = ((top["start_ns"] + top["end_ns"]) // 2).to_numpy()
    if len(ranges):
        for gtid, thread_ranges in ranges.groupby("gtid", sort=False):
            idx = iv.innermost(thread_ranges["start_ns"], thread_ranges["end_ns"], np.zeros(len(thread_ranges)),
                               mids, np.zeros(len(mids)))
            for gap_row, i in zip(top.itertuples(), idx):
                if i >= 0:
                    r = thread_ranges.iloc[int(i)]
                    rows.append({"device_id": device_id, "gap_start_ns": gap_row.start_ns,
                                 "gap_ns": gap_row.duration_ns, "cause": gap_row.cause,
                                 "thread": trace.thread_label(int(gtid)), "what": "nvtx", "name": str(r["name"]),
                                 "overlap_ns": _overlap(r.start_ns, r.end_ns, gap_row.start_ns, gap_row.end_ns)})
    for gap_row in top.itertuples():
        inside = slow_api[(slow_api["start_ns"] < gap_row.end_ns) & (slow_api["end_ns"] > gap_row.start_ns)]
        for api in inside.itertuples():
            rows.append({"device_id": device_id, "gap_start_ns": gap_row.start_ns,
                         "gap_ns": gap_row.duration_ns, "cause": gap_row.cause,
                         "thread": trace.thread_label(int(api.gtid)), "what": "cuda_api", "name": str(api.name),
                         "overlap_ns": _overlap(api.start_ns, api.end_ns, gap_row.start_ns, gap_row.end_ns)})
    return pd.DataFrame(rows).sort_values(["gap_ns", "gap_start_ns"], ascending=[False, True], ignore_index=True) \
        if rows else pd.DataFrame(rows)


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return int(max(0, min(a1, b1) - max(a0, b0)))


# The fix for each cause of idle GPU time: the findings of the questions that count a cause (sync, cpu_bound,
# straggler, unexplained_idle) say it.
CAUSE_FIXES = {
    "sync": ("Stop syncing the host every step: keep losses/metrics on the GPU (loss.detach()) and call .item()/.cpu() "
             "only every N steps; avoid torch.cuda.synchronize() in the loop."),
    "copy": "Copy from pinned memory with non_blocking=True (DataLoader(pin_memory=True); x.to(device, non_blocking=True)).",
    "cuda_api": ("Keep slow CUDA calls out of the loop: pre-allocate and reuse tensors (avoid cudaMalloc/cudaFree churn), "
                 "warm up (cuDNN autotuning, module loading) before the steps you time."),
    "optimizer": "Use a fused or foreach optimizer (e.g. torch.optim.AdamW(..., fused=True)) to cut per-parameter launches.",
    "backward": ("The CPU cannot launch backward kernels fast enough: try torch.compile, CUDA graphs, or a larger batch "
                 "so each launch does more work."),
    "forward": ("The CPU cannot launch forward kernels fast enough: try torch.compile, CUDA graphs, or a larger batch "
                "so each launch does more work."),
    "other_range": "Move the work inside the named NVTX range off the critical path (another thread, fewer calls per step).",
    "launch_bound": ("The GPU finishes each kernel before the CPU queues the next: capture the step in a CUDA graph "
                     "(torch.compile(model, mode='reduce-overhead') or torch.cuda.graphs), use fused optimizers, "
                     "or give each kernel more work (larger batch)."),
    "unattributed": ("The CPU is busy outside any NVTX range: run under nvtx_autotrace, or sample Python "
                     "(nsys profile --python-sampling=true) to see where."),
}
