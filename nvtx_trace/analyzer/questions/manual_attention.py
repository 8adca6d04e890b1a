"""Is attention written by hand (softmax(Q @ K.T) @ V) where one fused kernel would do?

A hand-written attention runs a softmax kernel (forward and backward) per layer between batched GEMMs, plus
the scale, mask and dropout kernels, and stores the t x t score matrix for backward. SDPA
(``F.scaled_dot_product_attention``) runs it as one flash kernel that never stores that matrix. The sign in
the kernels: softmax kernels at least twice a step (the loss's log-softmax runs once) and no fused attention
kernel. The prediction: the time of the softmax kernels times a factor measured on an H100 (every t x t pass
of the hand-written attention scales with the softmax's, and flash's own work is a small part of it).
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct

# GPT-2 small, bf16 autocast, batch 8, seq 1024, H100 (programs/busy/RESULTS.md): the hand-written attention's
# softmax kernels took 7.44 ms a step in the capture's window; SDPA took the plain step from 74.26 to 29.14 ms:
# 45.1 ms = 6.06x that time. Held out: seq 512, batch 16: softmax 4.05 ms a step, predicted step 52.99 -> 28.44 ms
# (captured), measured plain 52.5 -> 28.9 ms.
SDPA_SAVED_PER_SOFTMAX = 6.06
LOW_PRECISION = ("gemm_bf16", "gemm_fp16", "gemm_fp8")
FIX = ("Replace the hand-written attention (softmax(q @ k.transpose(-2, -1) * scale + mask) @ v) by "
       "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=True) "
       "(Hugging Face: attn_implementation='sdpa' or 'flash_attention_2'); it runs as one fused flash kernel "
       "and never stores the t x t score matrix; with nn.MultiheadAttention, call it with need_weights=False")


MIN_PER_STEP = 2  # per name, step and GPU: a loss's log-softmax runs once (per micro-batch and loss)
MIN_TOTAL_PER_STEP = 4  # forward and backward of at least two layers


def _softmax_kernels(k):
    names = k.by_name[(k.by_name["category"] == "norm_softmax") & k.by_name["name"].str.contains("softmax", case=False)]
    per_step = names["count"] / (max(k.steps, 1) * k.gpus)
    names = names[per_step >= MIN_PER_STEP]
    return names if names["count"].sum() / (max(k.steps, 1) * k.gpus) >= MIN_TOTAL_PER_STEP else names.iloc[:0]


def _fused_attention_elsewhere(k) -> bool:
    """Hand-written Triton flash kernels (`_attn_fwd`, FlexAttention's templates) carry no attention category name."""
    return bool(k.by_name["name"].str.contains(r"attn|_fwd_kernel|flex_attention|triton_tem", case=False).any())


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns or not k.steps or k.time("attention") or _fused_attention_elsewhere(k):
        return []
    soft = _softmax_kernels(k)
    soft_ns = int(soft["time_ns"].sum())
    low = k.time(*LOW_PRECISION) >= 0.5 * k.time(*LOW_PRECISION, "gemm", "gemm_tf32", "gemm_fp32")
    # in fp32 or TF32 the matrix math dwarfs the softmax until the precision finding's fix shrinks it: judged
    # against the compute that fix leaves, so the attention is named in any precision (a GPT-2 in fp32 had it
    # named only once TF32 was on, fifth; SDPA then measured 1.21x)
    against = k.compute_ns if low else max(1, k.compute_ns - k.time("gemm_fp32", "gemm_tf32"))
    if not len(soft) or soft_ns < THRESHOLDS["manual_attention_share"] * against \
            or soft_ns < THRESHOLDS["min_impact_ns"] or not k.time(*LOW_PRECISION, "gemm", "gemm_tf32", "gemm_fp32"):
        return []
    per_launch = int(soft["count"].sum()) / k.steps / k.gpus
    title = (f"Attention written by hand, it seems: {ms(soft_ns)} of GPU time in softmax kernels "
             f"({pct(soft_ns / k.compute_ns)} of the GPU's compute in the window"
             + (f", {per_launch:.0f} a step" if per_launch else "") + ") between matrix multiplications, "
             "and no fused attention kernel")
    predicted, why = None, ""
    if k.steps and low:
        saved = k.per_step(soft_ns) * SDPA_SAVED_PER_SOFTMAX
        predicted = predict.gpu_work_saved(
            analysis, saved, f"{ms(saved)} per step: {SDPA_SAVED_PER_SOFTMAX}x the softmax kernels' "
                      f"{ms(k.per_step(soft_ns))}, the factor measured between a hand-written and an SDPA "
                      "GPT-2 (bf16, H100)", gpu_bound=False)
    elif k.steps:
        why = (". Not predicted: the matrix math is not in bf16/fp16, where the flash kernel runs (in fp32 SDPA "
               "falls back to slower kernels); change the precision first.")
    return [Finding(
        kind="manual_attention", title=title, impact_ns=soft_ns,
        fix=predict.with_expected(FIX, predicted) if predicted else FIX + (why or predict.not_gpu_bound(analysis) or "."),
        recommend={"sdpa": True}, predicted=predicted,
        threshold=f"softmax kernels at least twice a step, >= {pct(THRESHOLDS['manual_attention_share'])} of the "
                  "GPU's compute in the window, and no fused attention kernel",
        evidence={"softmax_ns": soft_ns, "compute_ns": k.compute_ns, "sdpa_saved_per_softmax": SDPA_SAVED_PER_SOFTMAX,
                  "facts": facts(analysis), "kernels": soft.head(10)},
    )]


QUESTION = Question(
    name="manual_attention", order=118, needs=("kernels", "steps", "settings"),
    thresholds={"manual_attention_share": 0.03},  # softmax kernels at 3 % of the GPU's compute in the window
    findings=_findings, work_kinds=("manual_attention",),
)
