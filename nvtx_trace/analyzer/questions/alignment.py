"""Do GEMMs run as misaligned kernels because a dimension is not a multiple of 8 (a vocabulary of 50257)?

cuBLAS picks CUTLASS kernels that read one element at a time (``align1`` in their names) when a leading
dimension is not a multiple of the vector width; the usual culprit is an LM head over a vocabulary like
GPT-2's 50257. Padding the dimension (to a multiple of 64) lets it use the fast kernels.

Tensor-core GEMMs only: for fp32 on CUDA cores cuBLAS picks ``simt_sgemm_..._align1`` kernels whatever the
shapes. Measured on an H100 (programs/ddp_train.py, fp32): the align1 kernels stayed, 776 launches and 5.2 ms
either way, when its only odd dimension (a head of 10 classes) was padded to 16: the 1024-wide layers ran them.
The precision finding covers those GEMMs; under TF32 or bf16 a real misalignment shows here.
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.kernel_kinds import ALIGNED_RATIO, misaligned_kernels, saved_per_step
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct


def _pad_words(analysis) -> str:
    """Which dimension to pad, and to what: the largest matrix layer with an odd dimension, where the settings
    record names it; else the usual culprit, said as an example."""
    odd = ((analysis.settings or {}).get("odd_dimensions") or [None])[0]
    if not odd:
        return ("Pad the dimension that is not a multiple of 8, usually the vocabulary (GPT-2's 50257 -> 50304, a "
                "multiple of 64)")
    n = int(odd["odd"])
    by8, by64 = -(-n // 8) * 8, -(-n // 64) * 64
    return (f"Pad {odd['module']} ({odd['class']} {' x '.join(str(d) for d in odd['dims'])}): {n} -> {by8} (a "
            f"multiple of 8; {by64} for 64)")


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns:
        return []
    bad, misaligned = misaligned_kernels(k)
    if misaligned < THRESHOLDS["misaligned_share"] * k.compute_ns or misaligned < THRESHOLDS["min_impact_ns"]:
        return []
    fix = _pad_words(analysis) + (" (Hugging Face: model.resize_token_embeddings(len(tokenizer), "
                                  "pad_to_multiple_of=64)); padded rows are never predicted if the labels never use them")
    predicted = None
    if k.steps:
        saved = saved_per_step(k, misaligned)
        what = (f"{ms(saved)} of misaligned tensor-core GEMM time per step goes (aligned kernels {ALIGNED_RATIO:.0f}x "
                "faster on the same shapes, measured on an H100)")
        predicted = predict.gpu_work_saved(analysis, saved, what)
    return [Finding(
        kind="alignment",
        title=(f"Misaligned GEMMs: {ms(misaligned)} of GPU time ({pct(misaligned / k.compute_ns)} of the GPU's compute "
               f"in the window) in tensor-core kernels that read one element at a time "
               f"({', '.join(bad['name'].head(3))})"),
        impact_ns=misaligned,
        fix=predict.with_expected(fix, predicted) if predicted else fix + predict.not_gpu_bound(analysis),
        recommend=None, predicted=predicted,
        threshold=(f">= {pct(THRESHOLDS['misaligned_share'])} of the GPU's compute in the window in tensor-core align1 "
                   "GEMM kernels"),
        evidence={"facts": facts(analysis), "misaligned_ns": misaligned, "tensor_core_ns": misaligned,
                  "compute_ns": k.compute_ns,
                  "aligned_ratio": ALIGNED_RATIO, "kernels": bad.head(10)},
    )]


QUESTION = Question(
    name="alignment", order=117, needs=("kernels", "steps", "settings"),
    thresholds={"misaligned_share": 0.05},  # tensor-core align1 GEMMs at 5 % of the GPU's compute in the window
    findings=_findings, work_kinds=("alignment",),
)
