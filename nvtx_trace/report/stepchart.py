"""Per-step stacked bars for the HTML report, drawn from the ``step_breakdown`` question's table."""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.units import ms

PARTS = [  # column, legend, colour: a report with GPU activity (the GPU's view)
    ("compute_ns", "GPU computing", "#2e7d32"),
    ("loader_ns", "GPU idle: waiting for data", "#ef6c00"),
    ("copy_ns", "GPU idle: host-side copies", "#6a1b9a"),
    ("sync_ns", "GPU idle: host syncs", "#c62828"),
    ("other_ns", "GPU idle: other causes, short gaps", "#9e9e9e"),
]
HOST_PARTS = [  # without GPU activity (the training thread's view), each drawn only where it was measured
    ("loader_ns", "waiting for data (in the DataLoader)", "#ef6c00"),
    ("sync_ns", "host syncs", "#c62828"),
    ("cpu_ns", "the rest: the training thread's own CPU work", "#5c6bc0"),
]
MAX_BARS = 400


def without_gpu(bd: pd.DataFrame) -> bool:
    """The breakdown of a report with no GPU activity: its GPU parts are all unmeasured."""
    return bool(bd["compute_ns"].isna().all())


def parts(bd: pd.DataFrame) -> list[tuple[str, str, str]]:
    """The parts this breakdown measured, as drawn (column, legend, colour)."""
    return [p for p in (HOST_PARTS if without_gpu(bd) else PARTS) if bd[p[0]].notna().any()]


def figure(bd: pd.DataFrame) -> tuple[dict, str | None]:
    """Stacked bars, one per step (or per run of steps beyond MAX_BARS); returns (figure, note)."""
    note = None
    drawn = parts(bd)
    k = max(1, int(np.ceil(len(bd) / MAX_BARS)))
    if k > 1:  # warm-up steps keep their own bars: averaged in, one 8 s step would hide the rest
        n_steps = len(bd)
        warm = bd[bd["warmup"].astype(bool)]
        rest = bd[~bd["warmup"].astype(bool)].reset_index(drop=True)
        grp = np.arange(len(rest)) // k
        agg = {c: "mean" for c, _, _ in drawn}
        agg.update(step="first", duration_ns="mean", warmup="all")
        last = rest.groupby(grp)["step"].last().to_numpy()
        rest = rest.groupby(grp).agg(agg).reset_index(drop=True)
        xlabels = [str(x) for x in warm["step"]] + [f"{f}-{la}" for f, la in zip(rest["step"], last)]
        bd = pd.concat([warm[rest.columns], rest], ignore_index=True)
        note = f"{n_steps:,} steps are drawn as {len(bd):,} bars, each the mean of up to {k} consecutive steps"
    else:
        xlabels = [str(x) for x in bd["step"]]
    data = []
    for col, label, color in drawn:
        v = bd[col].to_numpy(np.float64)
        text = [f"<b>step {x}</b>{' (warm-up)' if w else ''}<br>{label}: {ms(n)} of {ms(d)}"
                for x, w, n, d in zip(xlabels, bd["warmup"], v, bd["duration_ns"])]
        data.append({"type": "bar", "name": label, "x": xlabels, "y": np.round(v / 1e6, 4).tolist(),
                     "marker": {"color": color}, "hovertext": text, "hoverinfo": "text",
                     "hoverlabel": {"namelength": 0}})
    layout = {"barmode": "stack", "height": 380, "margin": {"l": 60, "r": 10, "t": 30, "b": 50},
              "xaxis": {"title": {"text": "step (warm-up steps first)"}, "type": "category", "nticks": 40},
              "yaxis": {"title": {"text": "ms"}, "rangemode": "tozero"},
              "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "traceorder": "normal"},
              "hovermode": "closest",
              "plot_bgcolor": "white", "bargap": 0.15}
    warm = int(bd["warmup"].sum())
    steady_max = float(bd.loc[~bd["warmup"].astype(bool), "duration_ns"].max()) if warm < len(bd) else 0.0
    clipped = warm and steady_max and float(bd["duration_ns"].max()) > 3 * steady_max
    if clipped:  # one 8 s warm-up step would flatten every steady-state bar
        layout["yaxis"]["range"] = [0, round(1.15 * steady_max / 1e6, 3)]
    if 0 < warm < len(bd):
        layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "paper", "x0": -0.5, "x1": warm - 0.5,
                             "y0": 0, "y1": 1, "fillcolor": "rgba(255,224,130,0.25)", "line": {"width": 0},
                             "layer": "below"}]
        layout["annotations"] = [{"xref": "x", "yref": "paper", "x": warm - 0.5, "xanchor": "left", "y": 0.99,
                                  "yanchor": "top", "showarrow": False, "font": {"size": 11, "color": "#8d6e00"},
                                  "text": "← warm-up" + (" (bar cut off: hover it for its time)" if clipped else "")}]
    return {"data": data, "layout": layout}, note
