"""Is the GPU busy with many small memory-bound kernels (elementwise, layer normalization, softmax) that a
compiler would fuse?

From the kernel mix: eager PyTorch runs every elementwise op, cast, normalization and softmax as its own
kernel, each reading and writing its tensors in full; torch.compile fuses chains of them into a few Triton
kernels. No finding when the program is already compiled (its Triton kernels hold a real share of the GPU
work). Batch normalization in training is left out: its statistics are a reduction over the whole batch,
which a compiler cannot fuse across (compiled ResNet-50 spent as long in it). The prediction removes the
calibrated share of the fusable kernels' time (FUSION_REMOVED).
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding, ms, pct
from nvtx_trace.analyzer.question import Question

FUSABLE = ("elementwise", "norm_softmax", "reduction")
# Measured on an H100 (programs/busy/gpt_train.py, GPT-2-small class, bf16 autocast, nsys captures eager and
# compiled): torch.compile took its elementwise, normalization, softmax and reduction kernels from 47.03 to
# 15.23 ms a step (68 % removed), GEMM time unchanged. Checked on ResNet-50 channels_last fp32 (held out): its
# fusable kernels (batch norm aside) went from 12.74 to about 6.3 ms a step (51 %); predicted step 45.2 ->
# measured 45.2 ms plain (README, "Busy GPU").
FUSION_REMOVED = 0.68


def _time(k, cats) -> int:
    c = k.by_category
    return int(c.loc[c["category"].isin(cats), "time_ns"].sum())


def _findings(a, basis) -> list[Finding]:
    k = a.kernels
    if k is None or not k.time_ns:
        return []
    fusable, triton = _time(k, FUSABLE), _time(k, ("triton",))
    if triton >= THRESHOLDS["compiled_triton_share"] * k.time_ns:
        return []  # compiled already: what is left unfused is outside the compiled graph
    if fusable < THRESHOLDS["fusion_share"] * k.time_ns or fusable < THRESHOLDS["min_impact_ns"]:
        return []
    n_gpus = max(1, len(a.idle.devices) if a.idle else 1)
    per_step = fusable / k.steps / n_gpus if k.steps else None
    parts = ", ".join(f"{r.label} {pct(r.share)}" for r in k.by_category.itertuples() if r.category in FUSABLE)
    names = k.by_name[k.by_name["category"].isin(FUSABLE)]
    launches = int(names["count"].sum())
    softmax = names[names["name"].str.contains("softmax", case=False, na=False)]
    attention = _time(k, ("attention",))
    fix = ("Compile the model: model = torch.compile(model) (Hugging Face Trainer: torch_compile=True); it fuses "
           "chains of elementwise, normalization and softmax kernels into a few Triton kernels that read and write "
           "each tensor once. The first steps get slower while it compiles")
    per_step_softmax = int(softmax["count"].sum()) / k.steps if k.steps else 0
    if per_step_softmax > 2 and not attention:  # more than the loss's log-softmax forward and backward
        fix += ("; and if attention is written by hand (softmax of Q @ K.T, then @ V), use "
                "torch.nn.functional.scaled_dot_product_attention, which runs it as one fused kernel")
    what = (f"{pct(FUSION_REMOVED)} of the {ms(per_step)} per step of elementwise, normalization, softmax and "
            "reduction kernels goes (calibrated on a GPT-2-class model on an H100; GEMMs and batch norm unchanged)"
            ) if per_step else ""
    # fewer kernels means fewer launches too: a launch-bound step shortens at least as much
    predicted = predict.gpu_work_saved(a, per_step * FUSION_REMOVED, what, gpu_bound=False) if per_step else None
    return [Finding(
        kind="fusion",
        title=(f"Unfused memory-bound kernels: {ms(fusable)} of GPU time ({pct(fusable / k.time_ns)} of the window's "
               f"GPU work; {parts}) in {launches:,} launches" + (f", {ms(per_step)} a step" if per_step else "")
               + "; no compiler-generated kernels: the model runs eagerly"),
        impact_ns=int(fusable), fix=predict.with_expected(fix, predicted), recommend={"compile": True},
        predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['fusion_share'])} of the window's GPU work in elementwise, normalization, "
                  f"softmax and reduction kernels, Triton < {pct(THRESHOLDS['compiled_triton_share'])}",
        evidence={"fusable_ns": fusable, "triton_ns": triton, "gpu_work_ns": k.time_ns,
                  "fusion_removed": FUSION_REMOVED, "kernels": names.head(10)},
    )]


QUESTION = Question(
    name="fusion", order=116, needs=("kernels", "steps"),
    thresholds={"fusion_share": 0.25,  # unfused memory-bound kernels at 25 % of the window's GPU work
                "compiled_triton_share": 0.05},  # Triton kernels at 5 %: the program is compiled
    findings=_findings, work_kinds=("fusion",),
)
