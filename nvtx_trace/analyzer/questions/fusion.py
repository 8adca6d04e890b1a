"""Is the GPU busy with many small memory-bound kernels (elementwise, layer normalization, softmax) that a
compiler would fuse?

From the kernel mix: eager PyTorch runs every elementwise op, cast, normalization and softmax as its own
kernel, each reading and writing its tensors in full; torch.compile fuses chains of them into a few Triton
kernels. No finding when the program is compiled (Triton kernels hold a real share of the compute). Batch
normalization in training is left out: its statistics are a reduction over the whole batch, which a compiler
cannot fuse across (compiled ResNet-50 spent as long in it). The prediction removes the calibrated share of
the fusable kernels' time (FUSION_REMOVED).
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures import kernel_kinds as alignment
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct

FUSABLE = ("elementwise", "norm_softmax", "reduction")
# Calibrated on an H100 (programs/busy/gpt_train.py, GPT-2-small class, bf16 autocast, nsys captures eager and
# compiled): torch.compile took its elementwise, normalization, softmax and reduction kernels from 47.03 to
# 15.23 ms a step (68 % removed), GEMM time unchanged. Checked on ResNet-50 channels_last fp32 (not used to
# calibrate): those kernels, batch norm aside, lost about 51 %; predicted 42.7 ms, measured 45.2 ms plain.
FUSION_REMOVED = 0.68
# Fewer kernels also mean fewer launches, so a step the CPU's launches partly hold back shortens too; below
# this GPU busy share the step is set elsewhere (no measurement says by how much): no prediction.
MIN_BUSY = 0.5


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns:
        return []
    fusable, triton = k.time(*FUSABLE), k.time("triton")
    if triton >= THRESHOLDS["compiled_triton_share"] * k.compute_ns or (analysis.settings or {}).get("compiled_modules"):
        return []  # compiled already: what is left unfused is outside the compiled graph
    if fusable < THRESHOLDS["fusion_share"] * k.compute_ns or fusable < THRESHOLDS["min_impact_ns"]:
        return []
    per_step = k.per_step(fusable)
    parts = ", ".join(f"{r.label} {pct(r.time_ns / k.compute_ns)}" for r in k.by_category.itertuples()
                      if r.category in FUSABLE)
    names = k.by_name[k.by_name["category"].isin(FUSABLE)]
    softmax = names[names["name"].str.contains("softmax", case=False, na=False)]
    fix = ("Compile the model: model = torch.compile(model) (Hugging Face Trainer: torch_compile=True); it fuses "
           "chains of elementwise, normalization and softmax kernels into a few Triton kernels that read and write "
           "each tensor once. The first steps get slower while it compiles")
    softmax_per_step = int(softmax["count"].sum()) / k.steps / k.gpus if k.steps else 0
    if softmax_per_step > 2 and not k.time("attention"):  # more than the loss's log-softmax forward and backward
        fix += ("; and if attention is written by hand (softmax of Q @ K.T, then @ V), use "
                "torch.nn.functional.scaled_dot_product_attention, which runs it as one fused kernel")
    busy = (analysis.steps.summary() or {}).get("gpu_busy_fraction") if analysis.steps else None
    predicted = None
    if per_step and busy is not None and busy >= MIN_BUSY:
        what = (f"{pct(FUSION_REMOVED)} of the {ms(per_step)} per step of elementwise, normalization, softmax and "
                "reduction kernels goes (calibrated on a GPT-2-class model on an H100; GEMMs and batch norm "
                "unchanged)")
        _, misaligned_tc = alignment.misaligned_kernels(k)
        # measured in bf16 only: in TF32 (HF-style GPT-2, vocabulary 50257, H200) compile gained 52.55 -> 47.23 ms
        # where counting the pad of its 12.65 ms of align1 TF32 GEMMs predicted 30.18 ms
        low = k.time("gemm_bf16", "gemm_fp16") >= 0.5 * k.time("gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp32")
        padded = alignment.saved_per_step(k, misaligned_tc) if misaligned_tc and low else 0.0
        if padded:  # Inductor pads GEMM shapes that are not multiples of the vector width (HF-style bf16, measured)
            what += (f"; and {ms(padded)} of misaligned (align1) tensor-core GEMM time, as Inductor's pad_mm pass pads "
                     "their shapes (torch._inductor.config.shape_padding, on by default)")
        predicted = predict.gpu_work_saved(analysis, per_step * FUSION_REMOVED + padded, what, gpu_bound=False)
    compiled = f"Triton kernels {pct(triton / k.compute_ns)} of it" if triton else "no Triton kernels"
    return [Finding(
        kind="fusion",
        title=(f"Unfused memory-bound kernels: {ms(fusable)} of GPU time ({pct(fusable / k.compute_ns)} of the GPU's "
               f"compute in the window: {parts}; {compiled}) in {int(names['count'].sum()):,} launches"
               + (f", {ms(per_step)} a step" if per_step else "")),
        impact_ns=int(fusable),
        fix=predict.with_expected(fix, predicted) if predicted else fix + predict.not_gpu_bound(analysis),
        recommend={"compile": True}, predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['fusion_share'])} of the GPU's compute in the window in elementwise, "
                  f"normalization, softmax and reduction kernels, Triton < {pct(THRESHOLDS['compiled_triton_share'])}",
        evidence={"facts": facts(analysis), "fusable_ns": fusable, "triton_ns": triton, "compute_ns": k.compute_ns,
                  "fusion_removed": FUSION_REMOVED, "kernels": names.head(10)},
    )]


QUESTION = Question(
    name="fusion", order=116, needs=("kernels", "steps", "settings"),
    thresholds={"fusion_share": 0.25,  # unfused memory-bound kernels at 25 % of the GPU's compute in the window
                "compiled_triton_share": 0.05},  # Triton kernels at 5 %: the program is compiled
    findings=_findings, work_kinds=("fusion",),
)
