"""Which NCHW<->NHWC transposes run, and which modules cause them?"""

from __future__ import annotations

from nvtx_trace.analyzer.findings import THRESHOLDS, Finding, ms, pct
from nvtx_trace.analyzer.layout import analyze_layout, launch_filter
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.questions.idle import gpu_missing


def _run(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        w = ctx.result.window
        ctx.result.layout = analyze_layout(ctx.trace, (w["start_ns"], w["end_ns"]) if w else None,
                                           (ctx.result.settings or {}).get("module_sites"))
    else:
        ctx.result.skipped["layout_transpose"] = gpu_missing(ctx)


def _json(a) -> dict:
    if not a.layout:
        return {"transposes": None}
    lay = a.layout
    return {"transposes": {"count": lay.count, "time_ns": lay.time_ns, "kernel_time_ns": lay.kernel_time_ns,
                           "kernel_time_fraction": lay.kernel_time_fraction, "kernels": lay.by_kernel,
                           "modules": lay.by_module}}


def _tables(a) -> dict:
    return {"transpose_kernels": a.layout.by_kernel, "transpose_modules": a.layout.by_module} if a.layout else {}


def _findings(a, basis) -> list[Finding]:
    lay = a.layout
    if not lay or not lay.count or lay.kernel_time_fraction < THRESHOLDS["transpose_kernel_fraction"]:
        return []
    mods = lay.by_module.head(5)
    where = ", ".join(f"{m} [{p}]" for m, p in zip(mods["module"], mods["phase"]))
    called = list(dict.fromkeys(w for w in mods["where"] if isinstance(w, str)))[:3]
    return [Finding(
        kind="layout_transpose",
        title=f"{lay.count} NCHW<->NHWC transpose kernels took {ms(lay.time_ns)} of GPU time "
              f"({pct(lay.kernel_time_fraction)} of kernel time); top modules: {where}"
              + (f"; called at {', '.join(called)}" if called else ""),
        impact_ns=lay.time_ns,
        fix="Use channels_last: model = model.to(memory_format=torch.channels_last) and "
            "x = x.to(device, memory_format=torch.channels_last) for the inputs.",
        threshold=f">= {pct(THRESHOLDS['transpose_kernel_fraction'])} of kernel time",
        evidence={"kernels": lay.by_kernel, "modules": lay.by_module.head(20),
                  "nchw_batchnorm_ns": lay.nchw_batchnorm_ns, "batchnorm_saved_ns": lay.batchnorm_saved_ns},
    )]


def _html(a, d: dict, view) -> str:
    tr = d.get("transposes")
    if not tr or not tr["count"]:
        return ""
    t = a.tables
    return (view.table(t.get("transpose_kernels"), "Layout-transpose kernels (NCHW ↔ NHWC)",
                       {"name": "kernel", "count": "launches", "time_ns": "GPU time"},
                       f"{tr['count']:,} transposes took {ms(tr['time_ns'])}, {pct(tr['kernel_time_fraction'])} of "
                       "all kernel time.")
            + view.table(t.get("transpose_modules"), "…and the modules that caused them",
                         {"module": "module (NVTX range open at launch)", "phase": "phase", "count": "launches",
                          "time_ns": "GPU time", "via_fallback": "attributed via process-wide fallback",
                          **({"where": "called at"} if a.layout.by_module["where"].notna().any() else {})},
                         folder=(a.settings or {}).get("cwd")))


QUESTION = Question(
    name="layout", order=84, run=_run, needs=("window", "settings"), launches=launch_filter,
    thresholds={"transpose_kernel_fraction": 0.01},  # 1 % of kernel time spent in layout transposes
    findings=_findings, work_kinds=("layout_transpose",),
    json_keys=("transposes",), json_at=80, to_json=_json, tables=_tables,
    html=_html, html_at=30,
)
