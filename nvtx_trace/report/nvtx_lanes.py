"""NVTX lanes of the HTML timeline: one lane per thread and nesting depth, thinned to a budget.

Why lanes by depth: NVTX push/pop ranges nest (step > forward > module), and
nested bars drawn in one row would hide each other and make hover ambiguous.
Why thinning by time bin rather than "longest N": the longest ranges cluster
(warm-up), so keeping only them leaves most of the lane looking empty.
DataLoader worker processes get lanes like any other thread (their fetch
ranges are coloured like the "waiting for the next batch" gaps they feed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.units import ms

MAX_DEPTH = 4  # NVTX nesting levels drawn per thread
MAX_THREADS = 24  # NVTX thread lanes drawn


def nesting_depth(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Depth of each range in its thread's push/pop stack (0 = outermost); same order as the input.

    For properly nested ranges sorted by start, the ranges open when range i
    starts are those before it that have not ended: i - #(ends <= start_i).
    """
    order = np.lexsort((-ends, starts))
    depth = np.arange(starts.size) - np.searchsorted(np.sort(ends), starts[order], side="right")
    out = np.empty(starts.size, dtype=np.int64)
    out[order] = np.maximum(depth, 0)
    return out


def categories_of(range_names: pd.Series, categories: dict[str, str]) -> np.ndarray:
    """Each range's colour key, as the analysis gave it (``nvtx_categories``)."""
    return range_names.astype(str).map(categories).astype(object).where(lambda c: c.notna(), "other_range").to_numpy(
        dtype=object)


def build(ranges: pd.DataFrame, thread_labels: dict[int, str], cap: int, labels: list[str],
          notes: list[str], t0: int, steps_drawn: pd.DataFrame | None = None, categories: dict | None = None):
    """Assign each range a lane (thread x depth), keep the longest per lane within ``cap`` in total. The tool's
    own capture range and records are not the program's work: they get no lane; nor do the step ranges the
    steps lane already draws (``steps_drawn``: start_ns, end_ns), so each step is drawn and labelled once."""
    own = ranges["name"].astype(str)
    ranges = ranges[~(own.isin([names.CAPTURE_RANGE]) | own.str.startswith(
        names.ONCE_RECORDS + (names.MEMORY_PREFIX,)))]
    if steps_drawn is not None and len(steps_drawn) and len(ranges):
        drawn = pd.MultiIndex.from_arrays([steps_drawn["start_ns"].to_numpy(np.int64),
                                           steps_drawn["end_ns"].to_numpy(np.int64)])
        at = pd.MultiIndex.from_arrays([ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)])
        ranges = ranges[~(at.isin(drawn) & (categories_of(ranges["name"], categories or {}) == "step"))]
    per_thread = ranges.groupby("gtid").size().sort_values(ascending=False)
    threads = list(per_thread.index[:MAX_THREADS])
    if len(per_thread) > MAX_THREADS:
        notes.append(f"NVTX ranges of {len(per_thread) - MAX_THREADS} more thread(s) with the fewest ranges "
                     "are not drawn")
    frames = []
    too_deep = 0
    for gtid in threads:
        r = ranges[ranges["gtid"] == gtid]
        depth = nesting_depth(r["start_ns"].to_numpy(np.int64), r["end_ns"].to_numpy(np.int64))
        too_deep += int((depth >= MAX_DEPTH).sum())
        r = r.assign(depth=depth)[depth < MAX_DEPTH]
        base = thread_labels.get(int(gtid), f"thread {int(gtid) & 0xFFFFFF}")
        for d in range(int(r["depth"].max()) + 1 if len(r) else 0):
            frames.append(r[r["depth"] == d].assign(lane=len(labels)))
            labels.append(base if d == 0 else f"{base} · depth {d}")
    if too_deep:
        notes.append(f"{too_deep:,} NVTX ranges nested deeper than {MAX_DEPTH} levels are not drawn")
    if not frames:
        return None, []
    per_lane = max(10, cap // len(frames))
    total = sum(len(f) for f in frames)
    lanes = pd.concat([_thin_lane(f, per_lane // 2) for f in frames], ignore_index=True)
    merged = int((lanes["n"] > 1).sum())
    if merged:
        notes.append(f"{total:,} NVTX ranges drawn as {len(lanes):,} bars: ranges shorter than about "
                     f"1/{per_lane // 2:,} of a lane's time span are grouped ({merged:,} grouped bars, paler; "
                     "hover one for what it holds)")
    lanes["cat"] = categories_of(lanes["name"], categories or {})
    texts = []
    for n, s0, e0, k, top in zip(lanes["name"].astype(str), lanes["start_ns"], lanes["end_ns"], lanes["n"],
                                 lanes["top"]):
        if k == 1:
            texts.append(f"<b>{esc_plotly(n)}</b><br>{ms(e0 - s0)} at {(s0 - t0) / 1e9:.4f} s")
        else:
            texts.append(f"<b>{k:,} short NVTX ranges</b> grouped, {(s0 - t0) / 1e9:.4f}-{(e0 - t0) / 1e9:.4f} s"
                         f"<br>{top}")
    lanes["name"] = [esc_plotly(n) if k == 1 else "" for n, k in zip(lanes["name"].astype(str), lanes["n"])]
    return lanes, texts


def _thin_lane(f: pd.DataFrame, k: int) -> pd.DataFrame:
    """At most ~2k bars for one lane: ranges longer than span/k as they are, shorter ones grouped per time bin.

    Ranges of one thread at one depth do not overlap, so at most k are long;
    keeping whole time bins (rather than the k longest) keeps the lane's look
    true everywhere, not only where the longest ranges happen to be.
    """
    f = f.assign(n=1, top="")
    if len(f) <= 2 * k:
        return f
    lo, hi = int(f["start_ns"].min()), int(f["end_ns"].max())
    width = max((hi - lo) / k, 1.0)
    dur = (f["end_ns"] - f["start_ns"]).to_numpy()
    long = f[dur >= width]
    short = f[dur < width]
    if not len(short):
        return long
    b = ((short["start_ns"].to_numpy() - lo) // width).astype(np.int64)
    short = short.assign(bin=b)
    counts = short.groupby(["bin", "name"], observed=True).size().rename("c").reset_index()
    counts = counts.sort_values(["bin", "c"], ascending=[True, False])
    top = counts.groupby("bin").head(3).groupby("bin").apply(
        lambda g: "<br>".join(f"{esc_plotly(str(n))} ×{c:,}" for n, c in zip(g["name"], g["c"])), include_groups=False)
    dominant = counts.groupby("bin").head(1).set_index("bin")["name"]
    grp = short.groupby("bin").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), n=("n", "size"),
                                   lane=("lane", "first"), gtid=("gtid", "first"), depth=("depth", "first"))
    grp["name"] = dominant.reindex(grp.index).astype(str).to_numpy()
    grp["top"] = top.reindex(grp.index).to_numpy()
    return pd.concat([long, grp.reset_index(drop=True)], ignore_index=True)


def esc_plotly(text: str) -> str:
    """Plotly renders hover and bar text as a small HTML subset: user-controlled names must not be markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # plotly does not decode &quot;
