"""The HTML report's timeline: plotly figure dicts built from an Analysis, downsampled to a budget.

Why a budget: a real training run has millions of kernels, and a browser
drawing millions of SVG rectangles takes minutes and a 500 MB file. The
timeline therefore draws at most ``max_points`` items, chosen so that what a
user can see at full width stays true:

* GPU busy intervals are merged across the *shortest* idle slivers first
  (a 3 µs hole is invisible at any useful zoom), keeping every long gap.
* Idle gaps (the ones the analysis explains) keep the longest first.
* NVTX ranges keep the longest per lane; short ones are sub-pixel anyway.

Everything dropped or merged is counted in ``Timeline.notes`` so the page can
say so and name the option (``--html-max-points``) that controls it.

Every colour drawn is named in the legend: traces of one meaning share a
legend group (an orange gap and an orange data-loading range are one entry),
and ``_legend`` gives each group one entry named for what it holds. Step labels
are a text trace of their own, thinned by the page to what fits at the current
zoom (every k-th step, the lane's name saying which), never hidden one by one.

Lanes use a numeric y axis (one row per lane) so that busy lanes can be one
SVG path (a ``scatter`` line with ``None`` separators: cheap) while gaps and
NVTX ranges are horizontal bars (hover works anywhere on them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace.labels import IDLE_CAUSES as CAUSES
from nvtx_trace.report import nvtx_lanes
from nvtx_trace.report.nvtx_lanes import esc_plotly
from nvtx_trace.units import ms

DEFAULT_MAX_POINTS = 20_000
LANE_PX = 26
UTIL_BINS = 1500  # utilization profile per GPU: shows busy share where blocks are sub-pixel
MAX_LABELLED_BARS = 400  # names inside bars: fitting text is the costliest part of drawing (4k bars: +5 s)

BUSY_COLOR = "#2e7d32"
CAUSE_COLORS = {
    "dataloader": "#ef6c00", "sync": "#c62828", "copy": "#6a1b9a", "cuda_api": "#795548",
    "optimizer": "#d81b60", "backward": "#1565c0", "forward": "#42a5f5", "other_range": "#00897b",
    "unattributed": "#9e9e9e",
}
STEP_COLOR = "#b0bec5"
WARMUP_COLOR = "#ffe082"
BOUNDARY_COLOR = "rgba(55,71,79,0.35)"
WINDOW_COLOR = "rgba(46,125,50,0.06)"
UTILIZATION_FILL = "rgba(46,125,50,0.55)"
NVTX_NAMES = {  # NVTX ranges by colour category (measures.gpu_idle.range_categories, the analysis's nvtx_categories)
    "dataloader": "data-loading ranges (waits, worker fetches)", "sync": "sync ranges", "copy": "copy ranges",
    "optimizer": "optimizer ranges", "backward": "backward ranges", "forward": "forward ranges",
    "other_range": "other NVTX ranges", "step": "step ranges",
}
STEP_LANE = "steps"


@dataclass
class Timeline:
    figure: dict
    notes: list[str] = field(default_factory=list)  # what was aggregated, for the page
    items: int = 0  # drawn intervals (busy blocks + gaps + ranges + steps)
    step_labels: dict | None = None  # what the page needs to label the steps lane at any zoom (see _step_labels)


def cap_busy(starts: np.ndarray, ends: np.ndarray, cap: int, min_hole: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """Merge a sorted disjoint set into at most ``cap`` blocks by closing its shortest holes.

    Holes shorter than ``min_hole`` are closed whatever the count (they would be
    sub-pixel, and thousands of invisible slivers make a busy GPU look idle).
    Returns (starts, ends, widest hole closed in ns; 0 when nothing was merged).
    """
    n = starts.size
    if n == 0:
        return starts, ends, 0
    holes = starts[1:] - ends[:-1]
    keep = holes >= min_hole
    if keep.sum() > cap - 1:
        idx = np.flatnonzero(keep)
        keep[:] = False
        if cap > 1:
            keep[idx[np.argpartition(holes[idx], idx.size - (cap - 1))[idx.size - (cap - 1):]]] = True
    if keep.all():
        return starts, ends, 0
    widest_closed = int(holes[~keep].max())
    new_starts = np.concatenate([starts[:1], starts[1:][keep]])
    new_ends = np.concatenate([ends[:-1][keep], ends[-1:]])
    return new_starts, new_ends, widest_closed


def busy_share(busy: tuple[np.ndarray, np.ndarray], s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Busy fraction of each drawn block [s, e) (1.0 for a block that is one real interval)."""
    before = np.concatenate([[0], np.cumsum(busy[1] - busy[0])])
    i0 = np.searchsorted(busy[0], s, side="left")
    i1 = np.searchsorted(busy[0], e, side="left")  # blocks are unions of whole intervals
    return (before[i1] - before[i0]) / np.maximum(e - s, 1)


def _sec(ns, t0: int) -> list[float]:
    return np.round((np.asarray(ns, dtype=np.float64) - t0) / 1e9, 9).tolist()


def _bars(name: str, lanes, start_ns, end_ns, t0: int, text, color, legend: bool, group: str,
          label_inside=None, label_color: str = "white") -> dict:
    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    trace = {
        "type": "bar", "orientation": "h", "name": name, "legendgroup": group, "showlegend": legend,
        "y": np.asarray(lanes).tolist(), "base": _sec(start_ns, t0),
        "x": np.round(np.maximum(end_ns - start_ns, 1) / 1e9, 9).tolist(),
        "width": 0.8, "marker": {"color": color, "line": {"width": 0}},
        "hovertext": list(text), "hoverinfo": "text", "hoverlabel": {"namelength": 0},
    }
    if label_inside is not None and len(start_ns) <= MAX_LABELLED_BARS:
        trace.update({"text": list(label_inside), "textposition": "inside", "insidetextanchor": "start",
                      "textangle": 0,  # a name turned on its side in a narrow bar is unreadable: hidden instead
                      "textfont": {"size": 10, "color": label_color}, "cliponaxis": True})
    else:
        trace["textposition"] = "none"
    return trace


def build(analysis, ranges: pd.DataFrame | None, thread_labels: dict[int, str],
          max_points: int = DEFAULT_MAX_POINTS) -> Timeline:
    """The timeline figure: GPU busy/idle lanes, a step lane, NVTX lanes per thread and nesting depth."""
    max_points = max(int(max_points), 100)
    t0 = int(analysis.trace_start_ns)
    devices = analysis.idle.devices if analysis.idle else []
    notes: list[str] = []
    data: list[dict] = []
    labels: list[str] = []
    items = 0

    # ---- GPU lanes: busy as one path per device, gaps as bars coloured by cause ----
    busy_cap = max(50, max_points // 2 // max(len(devices), 1))
    gap_cap = max(50, max_points // 4 // max(len(devices), 1))
    gaps_all = analysis.idle.gaps if analysis.idle is not None else pd.DataFrame()
    gap_rows = []
    for dev in devices:
        gpu = _gpu_lane_name(analysis, dev.device_id)
        lane = len(labels)
        labels.append(f"{gpu} utilization")
        data.append(_utilization_trace(dev, lane, t0, UTIL_BINS))
        lane = len(labels)
        labels.append(f"{gpu} busy")
        labels.append(f"{gpu} idle gaps (cause)")  # own lane: zoomed out, 1-px gaps would hide busy
        span = int(dev.busy[1][-1] - dev.busy[0][0]) if dev.busy[0].size else 0
        s, e, closed = cap_busy(dev.busy[0], dev.busy[1], busy_cap, min(span // (4 * busy_cap), analysis.min_gap_ns))
        if closed:
            notes.append(f"GPU {dev.device_id}: {dev.busy[0].size:,} busy intervals drawn as {s.size:,} blocks "
                         f"(idle holes up to {ms(closed)} closed); a block's shade is its busy share")
        data += _busy_traces(dev, s, e, lane, t0, first=dev is devices[0])
        items += int(s.size)
        g = gaps_all[gaps_all["device_id"] == dev.device_id] if len(gaps_all) else gaps_all
        if len(g) > gap_cap:
            notes.append(f"GPU {dev.device_id}: the {gap_cap:,} longest of {len(g):,} idle gaps are highlighted")
            g = g.nlargest(gap_cap, "duration_ns")
        if len(g):
            gap_rows.append(g.assign(lane=lane + 1))
    if gap_rows:
        gaps = pd.concat(gap_rows, ignore_index=True)
        # Smallest cause first, largest drawn last (on top): zoomed out, sub-pixel gaps overlap and the
        # colour a user sees should be the cause that dominates. The legend lists them as the headline does:
        # largest in the steady window first (the view the page opens on), then by the whole trace.
        totals = gaps.groupby("cause")["duration_ns"].sum().sort_values()
        wc = getattr(analysis, "window_causes", None)
        in_window = wc.groupby("cause")["idle_ns"].sum() if wc is not None and len(wc) else pd.Series(dtype=float)
        listed = sorted(totals.index, key=lambda c: (-in_window.get(c, 0), -totals[c]))
        for cause in totals.index:
            g = gaps[gaps["cause"] == cause]
            bars = _bars(f"idle: {CAUSES.get(cause, cause)}", g["lane"], g["start_ns"], g["end_ns"], t0,
                         _gap_texts(g, t0), CAUSE_COLORS.get(cause, "#9e9e9e"), True, "cat:" + cause)
            bars["legendrank"] = 1000 + listed.index(cause)
            data.append(bars)
            items += len(g)

    # ---- steps lane (warm-up and steady steps, their labels) and boundaries ----
    step_lane, step_labels = None, None
    if analysis.steps is not None and len(analysis.steps.table):
        step_lane = len(labels)
        labels.append(STEP_LANE)
        st = analysis.steps.table
        step_cap = max(20, min(max_points // 20, 1000))
        shown = _group_steps(st, step_cap)
        if len(shown) < len(st):
            notes.append(f"{len(st):,} steps drawn as {len(shown):,} groups of consecutive steps")
        outline = {"color": "white", "width": 1} if len(shown) <= 200 else {"width": 0}  # neighbours apart
        for warm, name, color, group in ((True, "warm-up step", WARMUP_COLOR, "warmup"),
                                         (False, "step", STEP_COLOR, "cat:step")):
            sel = shown[shown["warmup"] == warm]
            if len(sel):
                bars = _bars(name, [step_lane] * len(sel), sel["start_ns"], sel["end_ns"], t0, sel["text"], color,
                             True, group)
                bars["marker"]["line"] = outline
                data.append(bars)
        step_labels = _step_labels(shown, step_lane, len(data), t0)
        data.append(step_labels.pop("trace"))
        items += len(shown)

    # ---- NVTX lanes: one per thread and nesting depth, longest ranges first; one trace per colour ----
    nvtx_first = len(labels)
    if ranges is not None and len(ranges):
        steps_drawn = analysis.steps.table if step_lane is not None else None
        lanes, texts = nvtx_lanes.build(ranges, thread_labels, max(50, max_points // 4), labels, notes, t0,
                                        steps_drawn=steps_drawn,
                                        categories=getattr(analysis, "nvtx_categories", None) or {})
        if lanes is not None and len(lanes):
            texts = np.asarray(texts, dtype=object)
            for cat in NVTX_NAMES:
                sel = (lanes["cat"] == cat).to_numpy()
                if not sel.any():
                    continue
                part = lanes[sel]
                bars = _bars(NVTX_NAMES[cat], part["lane"], part["start_ns"], part["end_ns"], t0, texts[sel],
                             CAUSE_COLORS.get(cat, STEP_COLOR), True, "cat:" + cat,
                             label_inside=part["name"].astype(str).tolist())
                bars["marker"]["opacity"] = np.where(part["n"] > 1, 0.5, 1.0).tolist()
                data.append(bars)
            items += len(lanes)

    # Step boundaries across every lane: one dashed path, not one shape per step.
    if step_lane is not None and len(labels):
        st = analysis.steps.table
        bounds = np.unique(np.concatenate([st["start_ns"].to_numpy(), st["end_ns"].to_numpy()]))
        if bounds.size <= max_points // 10:
            xs = np.empty(bounds.size * 3, dtype=object)
            xs[0::3] = xs[1::3] = _sec(bounds, t0)
            xs[2::3] = None
            data.append({"type": "scatter", "mode": "lines", "name": "step boundary", "legendgroup": "boundary",
                         "showlegend": True, "x": xs.tolist(), "y": [-0.5, len(labels) - 0.5, None] * int(bounds.size),
                         "line": {"color": BOUNDARY_COLOR, "width": 1, "dash": "dot"}, "hoverinfo": "skip"})
        else:
            notes.append(f"step boundaries are drawn only on the steps lane ({bounds.size:,} of them)")
    layout = _layout(analysis, labels, t0, nvtx_first)
    if any(sh.get("fillcolor") == WINDOW_COLOR for sh in layout["shapes"]):
        data.append(_window_key())
    _legend(data)
    _room_for_legend(layout, [t["name"] for t in data if t.get("showlegend")])
    figure = {"data": data, "layout": layout}
    return Timeline(figure=figure, notes=notes, items=items, step_labels=step_labels)


# Legend order: GPU lanes, idle causes (largest first, their own ranks), NVTX-only colours, then the steps.
LEGEND_RANKS = {"utilization": 0, "busy": 1, "cat:step": 3000, "warmup": 3001, "boundary": 3002, "window": 3003}


def _legend(data: list[dict]) -> None:
    """One legend entry per colour: the first trace of each legend group shows it, named for all the group
    holds (an idle-gap cause and the NVTX ranges of the same colour are one entry, toggled together)."""
    groups: dict[str, list[dict]] = {}
    for t in data:
        if t.get("legendgroup"):
            groups.setdefault(t["legendgroup"], []).append(t)
        else:
            t["showlegend"] = False
    for group, traces in groups.items():
        cat = group[4:] if group.startswith("cat:") else None
        gap = next((t for t in traces if cat and t["name"].startswith("idle: ")), None)
        nvtx = cat is not None and any(t["name"] == NVTX_NAMES.get(cat) for t in traces)
        steps = [t["name"] for t in traces if t["name"] == "step"]
        if cat == "step":
            name = " · ".join(x for x in ("step" if steps else None, NVTX_NAMES[cat] if nvtx else None) if x)
        elif cat is not None:
            name = " · ".join(x for x in (gap["name"] if gap else None, NVTX_NAMES[cat] if nvtx else None) if x)
        else:
            name = traces[0]["name"]
        holder = gap or traces[0]
        for t in traces:
            t["showlegend"] = t is holder
        holder["name"] = name
        rank = holder["legendrank"] if gap is not None else LEGEND_RANKS.get(group, 2000)  # gaps: largest first
        for t in traces:  # a group is placed by its traces' ranks: all of them the holder's
            t["legendrank"] = rank


def _room_for_legend(layout: dict, entries: list[str], width_px: int = 1150) -> None:
    """A top margin that holds the legend's rows (as they wrap on a page about ``width_px`` wide) below the
    modebar's row, and a height that keeps each lane LANE_PX tall whatever the legend takes."""
    rows, used = 1, 0.0
    for name in entries:
        w = 46 + 6.2 * len(name)  # swatch, gaps, 11 px text
        if used and used + w > width_px:
            rows, used = rows + 1, 0.0
        used += w
    plot_px = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
    layout["margin"]["t"] = 44 + 21 * rows
    layout["height"] = plot_px + layout["margin"]["t"] + layout["margin"]["b"]


def _window_key() -> dict:
    """A legend entry for the shaded steady window (a layout shape has none of its own)."""
    return {"type": "scatter", "mode": "markers", "name": "steady window (the findings' figures)",
            "legendgroup": "window", "x": [None], "y": [None], "hoverinfo": "skip",
            "marker": {"symbol": "square", "size": 14, "color": WINDOW_COLOR,
                       "line": {"color": "rgba(46,125,50,0.5)", "width": 1}}}


def _step_labels(shown: pd.DataFrame, lane: int, trace_index: int, t0: int) -> dict:
    """A text trace at each drawn step's middle, and what the page needs to thin it at any zoom: labels long
    (``step 12``) and short (``12``), and the number each is counted by for "every k-th" (the step's own
    number when drawn steps are numbered 0, 1, 2, ...; else the bar's index), so thinned labels read
    10, 20, 30 whatever the zoom."""
    mid = _sec((shown["start_ns"].to_numpy(np.int64) + shown["end_ns"].to_numpy(np.int64)) // 2, t0)
    first = shown["first"].to_numpy(np.int64)
    single = bool((shown["first"] == shown["last"]).all())
    keys = first if single and (len(first) < 2 or (np.diff(first) == 1).all()) else np.arange(len(shown))
    trace = {"type": "scatter", "mode": "text", "name": "step labels", "x": mid, "y": [lane] * len(shown),
             "text": shown["label"].tolist(), "textposition": "middle center", "cliponaxis": True,
             "textfont": {"size": 10, "color": "#263238"}, "hoverinfo": "skip", "showlegend": False}
    return {"trace": trace, "index": trace_index, "lane": lane, "lane_name": STEP_LANE,
            "long": shown["label"].tolist(), "short": shown["short"].tolist(), "keys": keys.tolist(),
            "unit": "step" if single else "bar"}


def _gpu_lane_name(analysis, device_id: int) -> str:
    """``GPU 1``; with one report per rank, ``rank 3 GPU 1``: each rank's lanes say whose they are."""
    rank = next((r["rank"] for r in analysis.ranks or () if device_id in r["device_ids"]), None)
    return f"GPU {device_id}" if rank is None else f"rank {rank} GPU {device_id}"


def _utilization_trace(dev, lane: int, t0: int, bins: int) -> dict:
    """Busy share per time bin as a step-shaped area inside the lane (full lane height = 100 %).

    Zoomed out on a long run, every busy block is narrower than a pixel and
    vanishes; this profile is what keeps a 19 %-busy GPU from looking idle.
    """
    lo, hi = int(dev.busy[0][0]), int(dev.busy[1][-1])
    edges = np.linspace(lo, hi, bins + 1).astype(np.int64)
    share = dev.busy_share(edges[:-1], edges[1:])
    top = lane + 0.42 - 0.84 * share
    x = np.repeat(_sec(edges, t0), 2)[1:-1]
    y = np.repeat(np.round(top, 4), 2)
    base = lane + 0.42
    text = [f"GPU {dev.device_id} busy {p:.0%}<br>{(a - t0) / 1e9:.3f}-{(b - t0) / 1e9:.3f} s"
            for a, b, p in zip(edges[:-1], edges[1:], share)]
    return {"type": "scatter", "mode": "lines", "name": "GPU utilization (height: busy share of a time bin)",
            "legendgroup": "utilization",
            "x": x.tolist() + [x[-1], x[0]], "y": y.tolist() + [base, base], "fill": "toself",
            "fillcolor": UTILIZATION_FILL, "line": {"color": BUSY_COLOR, "width": 1},
            "hovertext": list(np.repeat(text, 2)) + ["", ""], "hoverinfo": "text", "hoveron": "points"}


def _busy_traces(dev, s: np.ndarray, e: np.ndarray, lane: int, t0: int, first: bool) -> list[dict]:
    """Busy blocks as one SVG path per shade level (5 levels of busy share): cheap for 10k+ blocks.

    No hover: line vertices would win "closest" hover over the gap bars beside them.
    """
    share = busy_share(dev.busy, s, e)
    level = np.clip(np.ceil(share * 5), 1, 5).astype(int)
    out = []
    for lv in range(5, 0, -1):
        sel = np.flatnonzero(level == lv)
        if not sel.size:
            continue
        xs = np.empty(sel.size * 3, dtype=object)
        xs[0::3], xs[1::3], xs[2::3] = _sec(s[sel], t0), _sec(e[sel], t0), None
        out.append({"type": "scatter", "mode": "lines", "name": "GPU busy (shade: busy share of a block)",
                    "legendgroup": "busy", "x": xs.tolist(),
                    "y": [lane, lane, None] * int(sel.size), "hoverinfo": "skip",  # hover belongs to the gaps
                    "line": {"color": BUSY_COLOR, "width": LANE_PX * 0.62}, "opacity": 0.25 + 0.75 * lv / 5})
    return out


def _gap_texts(g: pd.DataFrame, t0: int) -> list[str]:
    """Hover text of each gap: how long, where, its dominant cause and the split among causes."""
    out = []
    cols = [(k, f"{k}_ns") for k in CAUSES if f"{k}_ns" in g.columns]
    for row in g.itertuples(index=False):
        d = row._asdict()
        parts = sorted(((d[c], k) for k, c in cols if d[c] > 0), reverse=True)[:4]
        split = "<br>".join(f"&nbsp;&nbsp;{CAUSES[k]}: {ms(v)}" for v, k in parts)
        out.append(f"<b>GPU {row.device_id} idle {ms(row.duration_ns)}</b> at {(row.start_ns - t0) / 1e9:.4f} s"
                   f"<br>cause: <b>{CAUSES.get(row.cause, row.cause)}</b><br>{split}")
    return out


def _group_steps(st: pd.DataFrame, cap: int) -> pd.DataFrame:
    """Steps as drawn: one bar each, or runs of k consecutive steps when there are more than ``cap``."""
    k = max(1, int(np.ceil(len(st) / cap)))
    grp = np.arange(len(st)) // k
    out = st.groupby(grp).agg(first=("step", "first"), last=("step", "last"), start_ns=("start_ns", "min"),
                              end_ns=("end_ns", "max"), duration_ns=("duration_ns", "mean"),
                              busy=("gpu_busy_ns", "sum"), total=("duration_ns", "sum"), warmup=("warmup", "all"),
                              loader=("loader_wait_ns", "sum"))
    one = out["first"] == out["last"]
    out["short"] = np.where(one, out["first"].astype(str), out["first"].astype(str) + "-" + out["last"].astype(str))
    out["label"] = np.where(one, "step ", "steps ") + out["short"]
    busy = out["busy"] / out["total"].where(out["total"] > 0, 1)
    wait = out["loader"] / out["total"].where(out["total"] > 0, 1)
    out["text"] = [f"<b>{lab}</b>{' (warm-up)' if w else ''}<br>{'mean ' if not o else ''}step time {ms(d)}"
                   f"<br>GPU busy {b:.0%} · CPU waiting for data {lw:.0%}"
                   for lab, w, o, d, b, lw in zip(out["label"], out["warmup"], one, out["duration_ns"], busy, wait)]
    return out.reset_index(drop=True)


def _layout(analysis, labels: list[str], t0: int, nvtx_first: int) -> dict:
    shapes = []
    w = analysis.window or {}
    xrange = None
    if w.get("start_ns") is not None and "steady" in str(w.get("source", "")):
        x0, x1 = (w["start_ns"] - t0) / 1e9, (w["end_ns"] - t0) / 1e9
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "layer": "below",
                       "x0": x0, "x1": x1, "y0": 0, "y1": 1,
                       "fillcolor": WINDOW_COLOR, "line": {"width": 0}})
        pad = 0.02 * (x1 - x0)
        xrange = [x0 - pad, x1 + pad]  # open on the steady state the findings describe
    if 0 < nvtx_first < len(labels):
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1,
                       "y0": nvtx_first - 0.5, "y1": nvtx_first - 0.5, "line": {"color": "#cfd8dc", "width": 1}})
    return {
        "height": 30 + LANE_PX * max(len(labels), 1) + 60 + 40,  # margins + lanes + the time axis
        "margin": {"l": 10, "r": 10, "t": 30, "b": 40},
        "barmode": "overlay", "bargap": 0, "hovermode": "closest", "dragmode": "zoom",
        "uniformtext": {"minsize": 8, "mode": "hide"},
        "xaxis": {"title": {"text": "seconds since the start of the trace"}, "ticksuffix": " s",
                  "zeroline": False, "showspikes": True, "spikemode": "across", "spikethickness": 1,
                  **({"range": xrange, "autorange": False} if xrange else {})},
        "yaxis": {"tickmode": "array", "tickvals": list(range(len(labels))),
                  "ticktext": [esc_plotly(x if len(x) <= 60 else x[:28] + "…" + x[-28:]) for x in labels],
                  "range": [len(labels) - 0.5, -0.5], "fixedrange": True, "automargin": True, "zeroline": False,
                  "ticklabelstandoff": 6,
                  "showgrid": False},
        "showlegend": True,  # even with one entry: every colour drawn is named
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "font": {"size": 11}, "tracegroupgap": 0},
        "shapes": shapes,
        "plot_bgcolor": "white",
    }
