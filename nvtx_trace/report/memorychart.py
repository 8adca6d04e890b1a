"""GPU memory per step for the HTML report, drawn from the ``memory`` question's ``per_step`` (nothing computed
beyond units): allocated at each step's start, the step's peaks, and the device's memory as a line above them."""

from __future__ import annotations

GIB = float(1 << 30)
LINES = [  # key, legend, colour, dash
    ("allocated_bytes", "allocated at the step's start", "#1565c0", "solid"),
    ("peak_allocated_bytes", "peak allocated in the step", "#c62828", "solid"),
    ("peak_reserved_bytes", "peak reserved by the allocator", "#ef6c00", "dot"),
]


def drawn(memory: dict | None) -> bool:
    return bool(memory and memory.get("per_step"))


def figure(memory: dict) -> dict:
    rows = memory["per_step"]
    steps = [r["step"] for r in rows]
    data = [{"type": "scatter", "mode": "lines+markers", "name": label, "x": steps,
             "y": [round(r[key] / GIB, 3) if r.get(key) is not None else None for r in rows],
             "line": {"color": color, "dash": dash}, "marker": {"size": 4},
             "hovertemplate": f"step %{{x}}<br>{label}: %{{y:.2f}} GiB<extra></extra>"}
            for key, label, color, dash in LINES]
    layout = {"height": 340, "margin": {"l": 60, "r": 10, "t": 30, "b": 50}, "plot_bgcolor": "white",
              "xaxis": {"title": {"text": "step"}}, "yaxis": {"title": {"text": "GiB"}, "rangemode": "tozero"},
              "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0}, "hovermode": "closest"}
    total = memory.get("device_total_bytes")
    if total:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": total / GIB,
                             "y1": total / GIB, "line": {"color": "#616161", "dash": "dash", "width": 1}}]
        layout["annotations"] = [{"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": total / GIB,
                                  "yanchor": "bottom", "showarrow": False, "font": {"size": 11, "color": "#616161"},
                                  "text": f"the device: {total / GIB:.1f} GiB"}]
    return {"data": data, "layout": layout}


def section(memory: dict | None) -> str:
    if not drawn(memory):
        return "<p class='muted'>GPU memory was not recorded (no CUDA in the program, or no nvtx_autotrace).</p>"
    return ("<p class='muted'>The caching allocator's counters, recorded by nvtx_autotrace as each step ended: "
            "what the step started with, its peaks, and the device's memory (dashed). A rising blue line is "
            "memory kept from step to step.</p><div id='memory-chart' class='plot'></div>")
