"""Does the optimizer update parameters one tensor at a time, or with many multi-tensor kernels, where one fused
kernel per group would do?

Three kinds, told by the settings record or, without one, by the kernels: a per-parameter loop
(``foreach=False``: a dozen small kernels per parameter, each launched from Python, no multi-tensor kernel
in the step), ``foreach`` (PyTorch's default on CUDA: multi-tensor kernels, one pass over memory per
operation) and ``fused`` (one kernel per chunk of tensors, one pass; no finding). Predictions, both measured
on an H100 with a GPT-2 small (AdamW, 148 tensors, 124 M parameters, programs/busy/RESULTS.md):
* foreach -> fused removes 68 % of the optimizer kernels' GPU time (3.7 ms a step; step 29.2 -> 26.7 ms);
* a loop -> fused removes the GPU's idle while ``optimizer.step`` runs (the training thread launches every
  kernel from Python), and the loop's kernels beyond the fused one's: those took 3.7x the fused kernel's time,
  (foreach -> fused on a launch-bound step, the same idle: a 12-block MLP held out on an H200, 8 CPUs allowed,
  gained 1.18-1.20x from fused=True by hand, where CUDA graphs of its forward and backward gained 1.06-1.13x)
  which is 9.6 ps a parameter (1.2 ms for 124 M), when the settings record says how many parameters.
  Held out: the HF-style model, whose AdamW(fused=False) is also a loop: predicted 52.1 -> 48.6 ms, measured
  48.4 (plain, ratio to the captured step).
"""

from __future__ import annotations

from nvtx_trace import names
from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.provenance import RECORDED, facts
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import name_mask
from nvtx_trace.units import ms, pct

FUSED_REMOVES = 0.68  # of a foreach optimizer's kernel time
FUSED_NS_PER_PARAMETER = 0.0096  # the fused AdamW kernel's time per parameter (H100)
LOOP_KERNELS_PER_FUSED = 3.7  # a per-parameter AdamW's kernels take 3.7x the fused kernel's time (H100)
FUSED_CLASSES = ("Adam", "AdamW", "SGD", "Adagrad")  # torch.optim classes that take fused=True on CUDA
FIX = ("Build the optimizer with fused=True, e.g. torch.optim.AdamW(params, lr=..., fused=True) (Adam, AdamW, SGD "
       "and Adagrad have it on CUDA; Hugging Face Trainer: optim='adamw_torch_fused'); it updates every parameter "
       "of a group in one kernel")


def _run(ctx: Context) -> None:
    """The training thread's time in ``optimizer.step`` per steady step (nvtx_autotrace's ranges), or None."""
    analysis, ranges = ctx.result, ctx.trace.ranges
    if not len(ranges) or not analysis.steps or not len(analysis.steps.steady):
        return
    hit = name_mask(ranges["name"], lambda n: n.startswith(names.OPTIMIZER_STEP_PREFIX))
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    start = ranges["start_ns"].to_numpy()
    hit &= (start >= w0) & (start < w1) & (ranges["pid"].to_numpy() == analysis.steps.pid)
    if hit.any():
        steps = len(analysis.steps.steady)
        inside = iv.union(start[hit], ranges["end_ns"].to_numpy()[hit])  # nested wrappers' ranges counted once
        closure = name_mask(ranges["name"], lambda n: n.startswith(names.OPTIMIZER_CLOSURE_PREFIX))
        if closure.any():  # step(closure): forward, loss and backward ran inside it, not the optimizer's work
            inside = iv.subtract(inside, iv.union(start[closure], ranges["end_ns"].to_numpy()[closure]))
        gpus = [d for d in (analysis.idle.devices if analysis.idle else []) if analysis.steps.pid in (d.pids or ())]
        idle = None
        if gpus:  # the training process's GPU(s) idle while optimizer.step runs: what launching costs the GPU
            idle = sum(iv.total(inside) - iv.total(iv.intersect(inside, d.busy)) for d in gpus) / len(gpus) / steps
        analysis.optimizer = {"step_ns_per_step": iv.total(inside) / steps, "ranges": int(hit.sum()),
                              "gpu_idle_ns_per_step": idle}


def _kind(analysis, kernels_per_step: float | None) -> tuple[str | None, str]:
    """(loop | foreach | fused | None, where that comes from). Without the record only a loop is told apart:
    a fused optimizer's kernels share the foreach one's short name (multi_tensor_apply_kernel)."""
    opts = [o for o in (analysis.settings or {}).get("optimizers") or []
            if o.get("class") in FUSED_CLASSES and str(o.get("module", "torch.optim")).startswith("torch.optim")]
    if opts:  # PyTorch's rule: both unset -> foreach on CUDA; one set False and the other unset -> the loop
        kinds = {"fused" if o.get("fused") else "foreach" if o.get("foreach") or (
            o.get("foreach") is None and o.get("fused") is None) else "loop" for o in opts}
        return next(k for k in ("loop", "foreach", "fused") if k in kinds), RECORDED
    if (analysis.settings or {}).get("optimizers"):
        return None, RECORDED  # not one of PyTorch's optimizers that take fused=True
    if kernels_per_step == 0 and analysis.optimizer:
        return "loop", facts(analysis)
    return None, facts(analysis)


def _parameters(analysis) -> int | None:
    """Elements the optimizers train (frozen parameters left out), from the settings record."""
    opts = (analysis.settings or {}).get("optimizers") or []
    trained = [o.get("trained_elements") for o in opts]
    if opts and all(isinstance(t, int) for t in trained):
        return int(sum(trained))
    dtypes = (analysis.settings or {}).get("parameter_dtypes") or {}  # records written before trained_elements existed
    return int(sum(dtypes.values())) if dtypes else None


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns or not k.steps:
        return []
    opt_ns = k.time("optimizer")
    per_step = k.per_step(opt_ns)
    kernels = int(k.by_category.loc[k.by_category["category"] == "optimizer", "count"].sum()) / k.steps / k.gpus
    kind, source = _kind(analysis, kernels)
    now, _ = predict.steady_step(analysis)
    host_bound = kind == "loop"  # the GPU idle while optimizer.step runs is this finding's (cpu_bound leaves it)
    if kind == "foreach":
        if opt_ns < THRESHOLDS["optimizer_share"] * k.compute_ns or opt_ns < THRESHOLDS["min_impact_ns"]:
            return []
        saved = per_step * FUSED_REMOVES
        predicted = predict.gpu_work_saved(analysis, saved, f"{pct(FUSED_REMOVES)} of the {ms(per_step)} per step of "
                                                     "multi-tensor optimizer kernels goes (measured between foreach "
                                                     "and fused AdamW on an H100)")
        idle = (analysis.optimizer or {}).get("gpu_idle_ns_per_step")
        if predicted is None and idle and predict.launch_bound(analysis):  # the host sets the pace: a fused step's one
            host_bound = True  # launch a group replaces the multi-tensor calls, their Python and their waits
            predicted = predict.host_time_saved(analysis, idle, f"the GPU's {ms(idle)} idle per step while optimizer.step "
                                                         "launches its multi-tensor kernels from Python goes")
        title = (f"The optimizer runs as {kernels:.0f} multi-tensor (foreach) kernels a step, {ms(per_step)} of GPU "
                 f"time a step ({pct(opt_ns / k.compute_ns)} of the GPU's compute in the window); fused does it "
                 "in one pass")
        impact = opt_ns
    elif kind == "loop" and analysis.optimizer and now and analysis.optimizer["gpu_idle_ns_per_step"] is not None:
        cpu, idle = analysis.optimizer["step_ns_per_step"], analysis.optimizer["gpu_idle_ns_per_step"]
        if cpu < THRESHOLDS["optimizer_share"] * now:
            return []
        params = _parameters(analysis)
        fused = params * FUSED_NS_PER_PARAMETER if params else 0.0
        extra = fused * (LOOP_KERNELS_PER_FUSED - 1)
        what = (f"the GPU's {ms(idle)} idle per step while optimizer.step launches a kernel per operation and "
                "parameter" + (f", and {ms(extra)} of the loop's own kernels beyond the fused kernel's {ms(fused)} "
                               f"({params / 1e6:.0f} M parameters; both measured on an H100)" if params else
                               " (the loop's kernels beyond a fused one's left out: the settings record would say "
                               "how many parameters there are)"))
        predicted = predict.host_time_saved(analysis, idle + extra, what)
        title = (f"The optimizer updates one parameter tensor at a time (neither foreach nor fused): optimizer.step takes "
                 f"{ms(cpu)} of the training thread a step ({pct(cpu / now)} of the step), launching each "
                 "update kernel from Python")
        impact = int((idle + extra) * len(analysis.steps.steady))
    else:
        return []
    zero = (analysis.settings or {}).get("zero_grad_set_to_none")
    fix = FIX + ("; and call optimizer.zero_grad(set_to_none=True) (the default), which frees the gradients instead "
                 "of filling them with zeros" if zero is False else "")
    return [Finding(
        kind="optimizer", title=title, impact_ns=int(impact),
        fix=predict.with_expected(fix, predicted) if predicted else fix + (predict.not_gpu_bound(analysis) or "."),
        recommend={"fused_optimizer": True} | ({"set_to_none": True} if zero is False else {}), predicted=predicted,
        threshold=f"foreach: its kernels >= {pct(THRESHOLDS['optimizer_share'])} of the GPU's compute in the window; "
                  f"a per-parameter loop: optimizer.step >= {pct(THRESHOLDS['optimizer_share'])} of the step",
        evidence={"optimizer": kind, "host_bound": host_bound, "facts": source, "kernels_per_step": kernels,
                  "kernel_ns_per_step": per_step,
                  "step_range_ns_per_step": analysis.optimizer["step_ns_per_step"] if analysis.optimizer else None,
                  "parameters": _parameters(analysis), "zero_grad_set_to_none": zero},
    )]


QUESTION = Question(
    name="optimizer", order=113, run=_run, needs=("kernels", "steps", "window", "settings"),  # before cpu_bound
    thresholds={"optimizer_share": 0.05},  # optimizer kernels (foreach) or optimizer.step (loop) at 5 %
    findings=_findings, work_kinds=("optimizer",),
)
