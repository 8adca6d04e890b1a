"""Which kernels take the GPU's time, by name (the whole trace)?"""

from __future__ import annotations

from nvtx_trace.analyzer.question import Context, Question


def _run(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        top = ctx.trace.kernel_time_by_name()
        total = max(int(top["time_ns"].sum()), 1)  # every kernel's time, as transposes.kernel_time_ns
        top = top.head(50)
        ctx.result.top_kernels = top.assign(mean_ns=top["time_ns"] / top["count"].clip(lower=1),
                                            kernel_time_share=top["time_ns"] / total)


def _html(analysis, d: dict, view) -> str:
    top = analysis.tables.get("top_kernels")
    if top is None or not len(top):
        return ""
    return view.table(top, "Top kernels by GPU time", {"name": "kernel", "count": "launches", "time_ns": "total",
                                                       "mean_ns": "mean", "kernel_time_share": "share of kernel time"})


QUESTION = Question(
    name="top_kernels", order=50, run=_run,
    tables=lambda analysis: {"top_kernels": analysis.top_kernels} if analysis.top_kernels is not None else {},
    html=_html, html_at=20,
)
