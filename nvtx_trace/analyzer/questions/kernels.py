"""What does the GPU do while it is busy? GPU time in the steady window by kind of work (the kernel mix).

Every kernel, copy and memset that starts in the window is counted once, by its own duration (kernels of
several streams may overlap, so shares are of GPU work time, not of wall time). Categories follow
analyzer/kernel_names.py (docs/kernel-categories.md); names that say nothing are judged by their
demangled form, which the kernel table's one pass brings for those names only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.findings import ms, pct
from nvtx_trace.analyzer.kernel_names import DEMANGLE_HINTS, LABELS, NeedsDemangled, category, shown_name
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.questions.idle import gpu_missing
from nvtx_trace.analyzer.trace.tables import GPU_OP_KINDS

TOP = 15  # kernels (and the copy and memset rows) listed by name
KIND_CATEGORY = {GPU_OP_KINDS.index(k): k for k in ("memcpy", "memset")}  # gpu_ops kind codes of copies and memsets
NOT_COMPUTE = ("collective", "memcpy", "memset")  # busy, but not the computation the findings judge
PERSISTENT = ("gemm", "conv", "attention", "triton")  # categories whose kernels may be persistent (few blocks by design)


def _run(ctx: Context) -> None:
    a = ctx.result
    if not ctx.trace.has_gpu_activity:
        a.skipped["kernels"] = gpu_missing(ctx)
        return
    ops = ctx.trace.gpu_ops
    w0, w1 = a.window["start_ns"], a.window["end_ns"]
    ops = ops[(ops["start_ns"] >= w0) & (ops["start_ns"] < w1)]
    duration = (ops["end_ns"] - ops["start_ns"]).to_numpy()
    kind = ops["kind"].to_numpy()
    rows = []
    for code, cat in KIND_CATEGORY.items():
        mine = kind == code
        if mine.any():
            rows.append({"name": LABELS[cat], "category": cat, "count": int(mine.sum()),
                         "time_ns": int(duration[mine].sum())})
    kernels = pd.DataFrame({"name_id": ops["name_id"].to_numpy()[kind == 0], "time_ns": duration[kind == 0]})
    by_id = kernels.groupby("name_id")["time_ns"].agg(["count", "sum"])
    names = ctx.reader.strings([i for i in by_id.index if i >= 0])
    split = _by_long_name(ctx, (w0, w1))
    for i, r in by_id.iterrows():
        if i in split:
            rows += split[i]
            continue
        short = names.get(i, "(unnamed kernel)")
        rows.append({"name": short, "category": category(short), "count": int(r["count"]), "time_ns": int(r["sum"])})
    steps = len(a.steps.steady) if a.steps and a.window.get("source", "").startswith("steady") else 0
    a.kernels = KernelMix(pd.DataFrame(rows, columns=["name", "category", "count", "time_ns"]), steps,
                          max(1, len(a.idle.devices) if a.idle else 1))
    small = ctx.trace.under_one_wave_kernels()
    if small is not None:
        collective = [i for i, n in names.items() if category(n) in NOT_COMPUTE]  # NCCL runs few blocks by design
        inside = (small["start_ns"] >= w0) & (small["start_ns"] < w1) & ~np.isin(small["name_id"], collective)
        # GEMM, convolution and attention libraries launch persistent kernels (one block per SM or fewer, each
        # looping over tiles): few blocks there is no sign of a small problem
        matrix = [i for i, n in names.items() if category(n).startswith(PERSISTENT)]
        plain = inside & ~np.isin(small["name_id"], matrix)
        span = small["end_ns"] - small["start_ns"]
        a.kernels.under_one_wave = {"count": int(inside.sum()), "time_ns": int(span[inside].sum()),
                                    "non_matrix_count": int(plain.sum()), "non_matrix_time_ns": int(span[plain].sum())}


def _announce(trace) -> None:
    """Short names that say nothing (or not their math): their kernels bring their demangled names."""
    trace.want_long_names(trace.reader.string_ids(DEMANGLE_HINTS, NeedsDemangled))


def _by_long_name(ctx: Context, window: tuple[int, int]) -> dict[int, list[dict]]:
    """Rows by demangled name for the kernels whose short name says nothing (read with the kernel table)."""
    df = ctx.trace.long_named_kernels()
    if df is None or not len(df):
        return {}
    df = df[(df["start_ns"] >= window[0]) & (df["start_ns"] < window[1])]
    df = df.assign(time_ns=df["end_ns"] - df["start_ns"])
    longs = ctx.reader.strings(pd.unique(df["long_id"]).tolist())
    shorts = ctx.reader.strings(pd.unique(df["name_id"]).tolist())
    out: dict[int, list[dict]] = {}
    for (short_id, long_id), g in df.groupby(["name_id", "long_id"]):
        short, long = shorts.get(int(short_id), ""), longs.get(int(long_id), "")
        out.setdefault(int(short_id), []).append({"name": shown_name(short, long), "category": category(short, long),
                                                  "count": len(g), "time_ns": int(g["time_ns"].sum())})
    return out


class KernelMix:
    """The window's GPU work by category and by kernel; ``steps``: steady steps it spans (0: no steps), over
    ``gpus`` GPUs (per-step figures are per GPU)."""

    def __init__(self, by_name: pd.DataFrame, steps: int, gpus: int = 1):
        self.steps, self.gpus = steps, gpus
        self.under_one_wave: dict | None = None  # kernels with fewer thread blocks than SMs (None: no grid sizes)
        self.time_ns = int(by_name["time_ns"].sum())
        total = max(self.time_ns, 1)
        by_name = by_name.groupby(["name", "category"], as_index=False)[["count", "time_ns"]].sum()
        self.by_name = by_name.sort_values(["time_ns", "name"], ascending=[False, True], ignore_index=True)
        self.by_name["share"] = self.by_name["time_ns"] / total
        cats = self.by_name.groupby("category", as_index=False)[["count", "time_ns"]].sum()
        cats = cats.sort_values(["time_ns", "category"], ascending=[False, True], ignore_index=True)
        cats.insert(1, "label", [LABELS[c] for c in cats["category"]])
        cats["time_ns_per_step"] = cats["time_ns"] / (steps * gpus) if steps else np.nan
        cats["share"] = cats["time_ns"] / total
        self.by_category = cats
        self.compute_ns = self.time_ns - self.time(*NOT_COMPUTE)  # what the busy-GPU findings judge

    def time(self, *categories: str) -> int:
        c = self.by_category
        return int(c.loc[c["category"].isin(categories), "time_ns"].sum())

    def share(self, *categories: str) -> float:
        c = self.by_category
        return float(c.loc[c["category"].isin(categories), "share"].sum())

    def per_step(self, ns: float) -> float | None:
        """GPU time per steady step and GPU; None without steps."""
        return ns / self.steps / self.gpus if self.steps else None


def _json(a) -> dict:
    k = a.kernels
    if k is None:
        return {"kernels": None}
    cats = k.by_category.astype(object)
    cats["time_ns_per_step"] = [None if pd.isna(v) else int(v) for v in k.by_category["time_ns_per_step"]]
    return {"kernels": {"time_ns": k.time_ns, "compute_ns": k.compute_ns, "steps": k.steps, "gpus": k.gpus,
                        "categories": cats, "top": k.by_name.head(TOP), "under_one_wave": k.under_one_wave}}


def _text(a, view) -> None:
    k = a.kernels
    if k is None or not k.time_ns:
        return
    rows = [[r.label, f"{int(r.count):,}", ms(r.time_ns_per_step) if k.steps else "-", pct(r.share)]
            for r in k.by_category.head(10).itertuples()]
    view.table(f"What the GPU does in the window: {ms(k.time_ns)} of GPU work"
               + (f", {ms(k.per_step(k.time_ns))} a step" + (" per GPU" if k.gpus > 1 else "") if k.steps else ""),
               [("kind of work", "left"), ("count", "right"), ("per step", "right"), ("share", "right")], rows)
    if k.under_one_wave and k.under_one_wave["count"]:
        w = k.under_one_wave
        view.print(f"Under one wave: {w['count']:,} kernels ({pct(w['time_ns'] / k.time_ns)} of the GPU work) ran "
                   "fewer thread blocks than the GPU has SMs", highlight=False)


def _html(a, d: dict, view) -> str:
    k = d.get("kernels")
    if not k or not k["time_ns"]:
        return ""
    t = a.tables
    return (view.table(t.get("kernel_categories"), "What the GPU does in the window (kernel mix)",
                       {"label": "kind of work", "count": "launches", "time_ns": "GPU time",
                        "time_ns_per_step": "per step", "share": "share of GPU work"},
                       f"{ms(k['time_ns'])} of GPU work in the steady window; categories follow the documented "
                       "kernel-name rules.")
            + view.table(t.get("kernels_by_name"), "Kernels by GPU time in the window",
                         {"name": "kernel", "category": "category", "count": "launches", "time_ns": "GPU time",
                          "share": "share of GPU work"}))


QUESTION = Question(
    name="kernels", order=105, run=_run, needs=("window", "steps"), announce=_announce,
    json_keys=("kernels",), json_at=115, to_json=_json,
    tables=lambda a: {"kernel_categories": a.kernels.by_category, "kernels_by_name": a.kernels.by_name}
    if a.kernels is not None else {},
    text=_text, text_at=85, html=_html, html_at=15,
)
