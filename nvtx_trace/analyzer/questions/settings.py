"""Which performance settings did the program run with (precision, optimizer, loaders, wrappers, debugging)?

nvtx_autotrace reads them once in the training process and writes them into the trace
(nvtx_autotrace/settings.py); this reads the last record back. A plain ``nsys profile`` capture has
none: the busy-GPU findings then infer what they need from kernel names and say so (``facts``).
"""

from __future__ import annotations

from nvtx_trace import names
from nvtx_trace.analyzer.measures.instrumentation_cost import read_record
from nvtx_trace.analyzer.question import Context, Question


def _run(ctx: Context) -> None:
    ranges = ctx.trace.ranges
    if len(ranges):
        pid = ctx.result.steps.pid if ctx.result.steps else None
        ctx.result.settings = read_record(ranges, names.SETTINGS_PREFIX, pid)
        _cpus_allowed(ctx.result)


def _cpus_allowed(analysis) -> None:
    """Worker counts and contention models use the CPUs the program may use (its affinity mask, a cgroup quota:
    a scheduler's or container's 16 of a 32-core host), not the host's."""
    allowed = (analysis.settings or {}).get("cpus_allowed")
    if isinstance(allowed, int) and allowed > 0 and (analysis.cpu_cores is None or allowed < analysis.cpu_cores):
        analysis.cpus_host = analysis.cpu_cores or (analysis.settings or {}).get("cpus_host")
        analysis.cpu_cores = allowed


def lines(s: dict) -> list[str]:
    """The record in a few phrases, the ones a reader of a busy-GPU finding checks first."""
    out = []
    dev = s.get("device") or {}
    if dev:
        mem = dev.get("memory_total_bytes") or 0
        peak = s.get("device_peak_allocated_bytes")
        out.append(f"{dev.get('name')} (compute {dev.get('capability')}, {dev.get('sm_count')} SMs"
                   + (f", peak {peak / 2**30:.1f} of {mem / 2**30:.0f} GiB allocated" if peak is not None and mem
                      else "") + ")")
    casts = ", ".join(f"{c.get('dtype')} on {c.get('device')}" for c in s.get("autocast") or [])
    out.append(f"autocast {casts}" if casts else "no autocast")
    out.append("TF32 matmuls " + ("on" if s.get("matmul_allow_tf32") or s.get("float32_matmul_precision") in
                                  ("high", "medium") else "off")
               + ", cuDNN TF32 " + ("on" if s.get("cudnn_allow_tf32") else "off")
               + ", cudnn.benchmark " + ("on" if s.get("cudnn_benchmark") else "off"))
    for o in s.get("optimizers") or []:
        mode = "fused" if o.get("fused") else "foreach" if o.get("foreach") else \
            "per-parameter (foreach=False)" if o.get("foreach") is False else "foreach by default"
        out.append(f"{o.get('class')} {mode}")
    if s.get("compiled_modules"):
        out.append(f"{s['compiled_modules']} compiled module(s)")
    if s.get("wrappers"):
        out.append("wrapped in " + ", ".join(s["wrappers"]))
    if s.get("anomaly_detection"):
        out.append("anomaly detection ON")
    if s.get("autograd_profiler"):
        out.append(f"autograd profiler ON ({s['autograd_profiler']})")
    return out


def _text(analysis, view) -> None:
    if analysis.settings:
        view.print("Settings (recorded): " + "; ".join(lines(analysis.settings)), highlight=False)
        flops = flops_line(analysis)
        if flops:
            view.print(flops, highlight=False)


def flops_line(analysis) -> str:
    """Model FLOPs (counted once in warm-up, where nvtx-trace tune asked for it) as FLOP/s at the profiled step,
    and the share of the device's dense peak for the math the step runs in."""
    from nvtx_trace import device_peaks

    flops = analysis.settings.get("model_flops_per_step")
    summary = analysis.steps.summary() if analysis.steps else {}
    step_ns = summary.get(f"step_ns_{summary.get('statistic') or 'median'}") if summary else None
    if not flops or not step_ns:
        return ""
    device = (analysis.settings.get("device") or {}).get("name")
    r = device_peaks.achieved(flops, step_ns / 1e6, device, device_peaks.precision_of(analysis.settings))
    peak = (f", {r['peak_fraction']:.0%} of the {device}'s dense {r['precision']} peak ({r['peak_tflops']:g})"
            if r["peak_fraction"] is not None else "")
    return (f"Model FLOPs: {flops / 1e12:.3g} TFLOP a step (counted in warm-up step "
            f"{analysis.settings.get('flops_step')}): {r['tflops']:g} TFLOP/s at the profiled step{peak}")


def _readable(value) -> str:
    """A recorded value as a reader takes it in: a mapping as ``key: value`` pairs, a list item by item (each
    optimizer on its own), not JSON with its braces and quotes."""
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_readable(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return " | ".join(_readable(v) for v in value) or "none"
    return "-" if value is None else str(value)


def _html(analysis, d, view) -> str:
    if not analysis.settings:
        return ""
    import pandas as pd

    rows = pd.DataFrame({"setting": list(analysis.settings), "value": [_readable(v) for v in analysis.settings.values()]})
    return view.table(rows.sort_values("setting"), "Settings, recorded by nvtx_autotrace",
                      {"setting": "setting", "value": "value"},
                      "read once in the training process after its first step; counters and peak memory as of the "
                      "capture window's start")


QUESTION = Question(
    name="settings", order=95, run=_run, needs=("steps",),
    json_keys=("settings",), json_at=118, to_json=lambda analysis: {"settings": analysis.settings},
    text=_text, text_at=72, html=_html, html_at=70,
)
