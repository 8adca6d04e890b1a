"""Is a debugging API on while the program trains (anomaly detection, the autograd profiler, emit_nvtx)?

Anomaly detection records a Python stack for every autograd node and checks every gradient for NaN, which
syncs the GPU; the autograd profiler and emit_nvtx add a record or an NVTX range per operator. On an H100 a
GPT-2 small step went from 29.2 ms to 124-155 ms with anomaly detection on (programs/busy/RESULTS.md). The
settings record says whether they are on; without it, emit_nvtx is seen by its ranges (``aten::...``).
The prediction: without them the step is bound by the GPU's own work per step (an at-most saving).
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.measures.provenance import RECORDED
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace.tables import name_mask
from nvtx_trace.units import ms

MIN_OPERATOR_RANGES = 50  # `aten::` ranges per step from which emit_nvtx is taken as on


def _run(ctx: Context) -> None:
    analysis, ranges = ctx.result, ctx.trace.ranges
    if not len(ranges) or not analysis.steps or not len(analysis.steps.steady):
        return
    hit = name_mask(ranges["name"], lambda n: n.startswith("aten::"))
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    start = ranges["start_ns"].to_numpy()
    per_step = int((hit & (start >= w0) & (start < w1)).sum()) / len(analysis.steps.steady)
    analysis.debug_apis = {"operator_ranges_per_step": per_step}


def _findings(analysis, basis) -> list[Finding]:
    s = analysis.settings or {}
    on = []
    if s.get("anomaly_detection"):
        on.append(("anomaly detection", "torch.autograd.set_detect_anomaly(False) (or remove "
                                         "torch.autograd.detect_anomaly())", RECORDED))
    if s.get("autograd_profiler"):
        on.append((f"the autograd profiler ({s['autograd_profiler']})", "leave torch.autograd.profiler.emit_nvtx() / "
                   "torch.profiler.profile() out of the training loop, or bound them to a few steps", RECORDED))
    elif (analysis.debug_apis or {}).get("operator_ranges_per_step", 0) >= MIN_OPERATOR_RANGES:
        on.append(("torch.autograd.profiler.emit_nvtx (aten:: ranges, "
                   f"{analysis.debug_apis['operator_ranges_per_step']:.0f} a step)",
                   "remove torch.autograd.profiler.emit_nvtx(); nvtx_autotrace's module ranges cost far less",
                   "inferred from its ranges (nsys --pytorch=autograd-nvtx writes the same ranges)"))
    if not on:
        return []
    now, stat = predict.steady_step(analysis)
    own = predict.own_work_per_step(analysis, stat) if now else 0.0
    predicted = predict.host_time_saved(analysis, now - own, "with debugging off the step is bound by the GPU's own work "
                                                      f"({ms(own)} a step), an at-most saving") if own else None
    what = " and ".join(w for w, _, _ in on)
    fix = "Turn debugging off for training runs: " + "; ".join(f for _, f, _ in on)
    return [Finding(
        kind="debug_apis", title=f"Debugging API on during training: {what}; it slows every step",
        impact_ns=0,  # its cost is the idle other findings already count (sync, cpu_overhead...): ranked by its prediction
        fix=predict.with_expected(fix, predicted) if predicted else fix + ".",
        recommend={"debug_apis": False}, predicted=predicted,
        threshold="anomaly detection or the autograd profiler on (settings record), or >= "
                  f"{MIN_OPERATOR_RANGES} aten:: ranges a step",
        evidence={"on": [w for w, _, _ in on], "facts": "; ".join(sorted({f for _, _, f in on})),
                  "beyond_gpu_work_ns_per_step": int(now - own) if own else None},
    )]


QUESTION = Question(
    name="debug_apis", order=121, run=_run, needs=("steps", "window", "settings"),
    findings=_findings, work_kinds=(),
)
