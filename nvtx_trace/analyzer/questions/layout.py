"""Which NCHW<->NHWC transposes run, and which modules cause them?

NCHW <-> NHWC layout-transpose kernels and the modules that caused them.

cuDNN runs fp16/bf16 convolutions in NHWC; fed NCHW tensors it wraps each
convolution in ``nchwToNhwcKernel`` / ``nhwcToNchwKernel`` (and friends),
in forward and in backward. ``channels_last`` on model and inputs removes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.kernel_kinds import TRANSPOSE_HINTS, TRANSPOSE_RE, gpu_missing, is_transpose
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace.attribution import attribute
from nvtx_trace.analyzer.trace.tables import Trace, name_mask
from nvtx_trace.units import ms, pct

# Batch norm over NCHW tensors runs kernels that its channels_last form runs faster, part of what channels_last
# gains beyond the transposes it removes: (name rule, how much faster in channels_last). Measured on ResNet-50,
# batch 128, H100: cuDNN's per-channel "1C11" kernels (fp32) 23.9 ms a step against its batchnorm_*_nhwc_* 16.0
# (device phase K1 against phase B); PyTorch's own kernels (bf16 autocast, where cuDNN is not used) 31.1 ms a
# step against their *_channels_last_kernel forms 14.0 (phase K4 against phase B).
NCHW_BATCHNORM = (
    (re.compile(r"(?:^|::)bn_(?:fw|bw)_"), 1.49),
    (re.compile(r"(?:^|::)batch_norm_(?:backward|collect_statistics|transform_input)_kernel"), 2.22),
)


@dataclass
class LayoutResult:
    count: int
    time_ns: int
    kernel_time_ns: int
    by_kernel: pd.DataFrame  # name, count, time_ns
    by_module: pd.DataFrame  # module, phase, count, time_ns, via_fallback, where (the line that called the module)
    nchw_batchnorm_ns: int = 0  # GPU time of NCHW batch-norm kernels (NCHW_BATCHNORM)
    batchnorm_saved_ns: int = 0  # of which channels_last's faster kernels would save (NCHW_BATCHNORM's factors)

    @property
    def kernel_time_fraction(self) -> float:
        return self.time_ns / self.kernel_time_ns if self.kernel_time_ns else 0.0


def launch_filter(trace: Trace) -> tuple[str, str, list[int]] | None:
    """Layout transposes as a launch request (table, column, name ids); None when no string names one.

    Taken from the string table, not the kernel table, so the runtime pass can start before the kernels are read.
    """
    if trace.kernel_name_column is None:
        return None
    ids = trace.reader.string_ids(TRANSPOSE_HINTS, TRANSPOSE_RE)
    return ("kernel", "name_id", ids) if ids else None


def analyze_layout(trace: Trace, window: tuple[int, int] | None = None,
                   module_sites: dict | None = None) -> LayoutResult:
    """Transposes (and NCHW batch norm) among the kernels that start in ``window`` (the steady window every
    finding is measured in), or in the whole trace without one. ``module_sites``: the line that called each
    module (the settings record's), so that each module's row says where the program runs it."""
    ops = trace.gpu_ops
    kernels = ops[ops["kind"].to_numpy() == 0]
    if window is not None:
        kernels = kernels[(kernels["start_ns"] >= window[0]) & (kernels["start_ns"] < window[1])]
    duration = (kernels["end_ns"] - kernels["start_ns"]).to_numpy()
    per_id = pd.DataFrame({"name_id": kernels["name_id"].to_numpy(), "time_ns": duration}) \
        .groupby("name_id")["time_ns"].agg(["count", "sum"])
    names = trace.reader.strings([int(i) for i in per_id.index if i >= 0]) if len(per_id) else {}
    per_name = pd.DataFrame({"name": [names.get(int(i), "") for i in per_id.index],
                             "count": per_id["count"].to_numpy(np.int64), "time_ns": per_id["sum"].to_numpy(np.int64)})
    per_name = per_name.groupby("name", as_index=False).sum().sort_values("time_ns", ascending=False,
                                                                          ignore_index=True)
    kernel_time = int(duration.sum())
    batchnorm = saved = 0
    for rule, speedup in NCHW_BATCHNORM if len(per_name) else ():
        ns = int(per_name.loc[per_name["name"].str.contains(rule), "time_ns"].sum())
        batchnorm, saved = batchnorm + ns, saved + int(ns * (1 - 1 / speedup))
    request = launch_filter(trace)
    if request is None:
        return LayoutResult(0, 0, kernel_time, per_name.iloc[:0], pd.DataFrame(
            columns=["module", "phase", "count", "time_ns", "via_fallback", "where"]), batchnorm, saved)
    launches = trace.launches_of(*request)
    if window is not None:
        launches = launches[(launches["start_ns"] >= window[0]) & (launches["start_ns"] < window[1])]
        launches = launches.reset_index(drop=True)
    by_kernel = per_name[per_name["name"].map(is_transpose)].reset_index(drop=True)
    return LayoutResult(count=int(len(launches)), time_ns=int((launches["end_ns"] - launches["start_ns"]).sum()),
                        kernel_time_ns=kernel_time, by_kernel=by_kernel,
                        by_module=_by_module(trace, launches, module_sites or {}),
                        nchw_batchnorm_ns=batchnorm, batchnorm_saved_ns=saved)


def module_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """nvtx_autotrace's module ranges when present, else every non-step range (user ranges)."""
    if not len(ranges):
        return ranges
    # The whole-pass `backward` range counts too: it is what the fallback finds when
    # per-module backward ranges are off.
    is_module = name_mask(ranges["name"], names.MODULE_RE.match)
    if is_module.any():
        is_module |= name_mask(ranges["name"], lambda c: c == names.BACKWARD)
        return ranges[is_module].reset_index(drop=True)
    return ranges[~name_mask(ranges["name"], names.STEP_RE.match)].reset_index(drop=True)


def _by_module(trace: Trace, launches: pd.DataFrame, module_sites: dict) -> pd.DataFrame:
    mods = module_ranges(trace.ranges)
    api_start = launches["api_start_ns"].to_numpy()
    api_gtid = launches["api_gtid"].to_numpy()
    idx, fallback = attribute(np.where(api_start >= 0, api_start, launches["start_ns"].to_numpy()), api_gtid,
                              launches["pid"].to_numpy(), mods)
    # Group by small integer codes (range, phase): millions of launches, a few hundred groups.
    range_keys, range_inv = np.unique(idx, return_inverse=True)
    range_names = mods["name"].astype(object).to_numpy() if len(mods) else np.array([], dtype=object)
    keys_module = [str(range_names[k]) if k >= 0 else "(no enclosing range)" for k in range_keys]
    keys_backward = np.array([m.startswith("backward") for m in keys_module], dtype=bool)
    gtids, gtid_inv = np.unique(api_gtid, return_inverse=True)
    autograd = np.array(["autograd" in trace.thread_names.get(int(g), "") for g in gtids], dtype=bool)
    backward = autograd[gtid_inv] | keys_backward[range_inv]
    group = range_inv * 2 + backward
    size = 2 * len(range_keys)
    count = np.bincount(group, minlength=size)
    present = np.flatnonzero(count)
    duration = (launches["end_ns"] - launches["start_ns"]).to_numpy()
    df = pd.DataFrame({
        "module": [_module_label(keys_module[g // 2]) for g in present],
        "phase": ["backward" if g % 2 else "forward" for g in present],
        "count": count[present].astype(np.int64),
        "time_ns": np.rint(np.bincount(group, weights=duration, minlength=size)[present]).astype(np.int64),
        "via_fallback": np.bincount(group, weights=fallback, minlength=size)[present].astype(np.int64),
    })
    # Ranges with the same label (one module called many times) fold into one row.
    out = df.groupby(["module", "phase"], as_index=False).sum()
    # a backward's kernels come from the same module: its forward's call line is the one to change
    out["where"] = pd.Series([module_sites.get(m) if isinstance(module_sites.get(m), str) else None
                              for m in out["module"]], index=out.index, dtype=object)
    return out.sort_values("time_ns", ascending=False, ignore_index=True)


def _module_label(range_name: str) -> str:
    m = names.MODULE_RE.match(range_name)
    if not m:
        return range_name
    return f"{m.group('path')} ({m.group('cls')})" if m.group("path") else f"({m.group('cls')})"


def _run(ctx: Context) -> None:
    if ctx.trace.has_gpu_activity:
        w = ctx.result.window
        ctx.result.layout = analyze_layout(ctx.trace, (w["start_ns"], w["end_ns"]) if w else None,
                                           (ctx.result.settings or {}).get("module_sites"))
    else:
        ctx.result.skipped["layout_transpose"] = gpu_missing(ctx.trace)


def _json(analysis) -> dict:
    if not analysis.layout:
        return {"transposes": None}
    lay = analysis.layout
    return {"transposes": {"count": lay.count, "time_ns": lay.time_ns, "kernel_time_ns": lay.kernel_time_ns,
                           "kernel_time_fraction": lay.kernel_time_fraction, "kernels": lay.by_kernel,
                           "modules": lay.by_module}}


def _tables(analysis) -> dict:
    if not analysis.layout:
        return {}
    return {"transpose_kernels": analysis.layout.by_kernel, "transpose_modules": analysis.layout.by_module}


def _findings(analysis, basis) -> list[Finding]:
    lay = analysis.layout
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


def _html(analysis, d: dict, view) -> str:
    tr = d.get("transposes")
    if not tr or not tr["count"]:
        return ""
    t = analysis.tables
    return (view.table(t.get("transpose_kernels"), "Layout-transpose kernels (NCHW ↔ NHWC)",
                       {"name": "kernel", "count": "launches", "time_ns": "GPU time"},
                       f"{tr['count']:,} transposes took {ms(tr['time_ns'])}, {pct(tr['kernel_time_fraction'])} of "
                       "all kernel time.")
            + view.table(t.get("transpose_modules"), "…and the modules that caused them",
                         {"module": "module (NVTX range open at launch)", "phase": "phase", "count": "launches",
                          "time_ns": "GPU time", "via_fallback": "attributed via process-wide fallback",
                          **({"where": "called at"} if analysis.layout.by_module["where"].notna().any() else {})},
                         folder=(analysis.settings or {}).get("cwd")))


def _predicted(analysis, f: Finding) -> dict | None:
    """The transposes' time per step goes, and batch norm's channels_last kernels are faster than its NCHW ones;
    only where the GPU is busy enough for its work to set the step's pace."""
    if not predict.steady_step(analysis)[0]:
        return None
    busy_share = analysis.steps.summary().get("gpu_busy_fraction")
    if busy_share is None or busy_share < predict.GPU_BOUND:
        return None  # the GPU mostly waits: less GPU work would not shorten the step
    per_step = predict.work_per_step(analysis, f.impact_ns)
    what = f"{ms(per_step)} of transpose kernels per step go"
    bn, saved = f.evidence.get("nchw_batchnorm_ns") or 0, f.evidence.get("batchnorm_saved_ns") or 0
    if saved:
        faster = predict.work_per_step(analysis, saved)
        per_step += faster
        what += (f", and NCHW batch norm ({ms(predict.work_per_step(analysis, bn))} a step) takes {ms(faster)} less in "
                 "channels_last (its kernels there measured 1.5-2.2x faster: ResNet-50, H100)")
    return predict.work_removed(analysis, per_step, what)


QUESTION = Question(
    name="layout", order=84, run=_run, needs=("window", "settings"), launches=launch_filter,
    thresholds={"transpose_kernel_fraction": 0.01},  # 1 % of kernel time spent in layout transposes
    findings=_findings, work_kinds=("layout_transpose",), predicts={"layout_transpose": _predicted},
    knobs={"layout_transpose": lambda finding, named: named or {"channels_last": True}},
    json_keys=("transposes",), json_at=80, to_json=_json, tables=_tables,
    html=_html, html_at=30,
)
