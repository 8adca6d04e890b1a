"""In the steady window: how busy is each GPU, why does it idle, and what did the CPU do in the largest gaps?"""

from __future__ import annotations

from nvtx_trace.analyzer.measures.gpu_idle import describe_gaps, summarize_causes
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms, pct


def _run(ctx: Context) -> None:
    analysis = ctx.result
    if not analysis.idle:
        return
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    for dev in analysis.idle.devices:
        busy = int(iv.Coverage(dev.busy).measure(w0, w1))
        analysis.window_utilization[dev.device_id] = busy / (w1 - w0) if w1 > w0 else 0.0
    analysis.window_causes = summarize_causes(analysis.idle.gaps, (w0, w1))
    analysis.gap_activity = describe_gaps(ctx.trace, analysis.idle, (w0, w1))


def _tables(analysis) -> dict:
    if analysis.window_causes is None:
        return {}
    return {"window_causes": analysis.window_causes, "gap_activity": analysis.gap_activity}


def _text(analysis, view) -> None:
    if analysis.window_causes is not None and len(analysis.window_causes):
        several = analysis.window_causes["device_id"].nunique() > 1
        cols = (["GPU"] if several else []) + ["cause", "idle", "of idle"]
        rows = [[*([str(r.device_id)] if several else []), r.label, ms(r.idle_ns), pct(r.share)]
                for r in analysis.window_causes.itertuples()]
        view.table("Why the GPU idles in the window", [(c, "left" if c == "cause" else "right") for c in cols], rows)
    if analysis.gap_activity is None or not len(analysis.gap_activity):
        return
    several = analysis.gap_activity["device_id"].nunique() > 1
    cols = (["GPU"] if several else []) + ["at", "gap", "cause", "thread", "inside"]
    rows = []
    keys = ["device_id", "gap_start_ns", "gap_ns", "cause"]
    for shown, ((device, start, gap_ns, cause), gap_rows) in enumerate(analysis.gap_activity.groupby(keys, sort=False)):
        if shown == 3:
            break
        for i, r in enumerate(gap_rows.head(4).itertuples()):
            label = r.name if r.what == "nvtx" else f"CUDA {r.name}"
            first = i == 0
            rows.append([*([str(device) if first else ""] if several else []),
                         ms(start - analysis.trace_start_ns) if first else "", ms(gap_ns) if first else "",
                         cause if first else "", view.escape(r.thread), view.escape(label)])
    view.table("Largest gaps: what the CPU was doing ('at': time since the trace began)",
               [(c, "right" if c in ("GPU", "at", "gap") else "left") for c in cols], rows)


QUESTION = Question(
    name="window_figures", order=100, run=_run, needs=("idle", "window"),
    results={"window_utilization": {},  # device -> busy share of the window
             "window_causes": None, "gap_activity": None},  # idle by cause; the largest gaps' CPU activity
    tables=_tables, text=_text, text_at=80,
)
