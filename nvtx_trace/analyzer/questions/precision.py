"""Do matrix multiplications and convolutions run in fp32 on CUDA cores (or TF32) where bf16 would do?

From the kernel mix: GEMM and convolution time by the math their kernel names state. fp32 on CUDA cores
-> TF32 (one line) and bf16 autocast; TF32 already -> bf16 autocast; a program whose matrix math is mostly
bf16/fp16 already gets no finding. Shares are of the GPU's compute in the window (collectives, copies and
memsets left out: a rank that waits in NCCL still computes slowly). The prediction divides the time of the
kernels that would change by the speed ratio measured for the GPU (analyzer/questions/precision.py), and for bf16
the elementwise kernels' too (bf16 activations move half the bytes).

How much faster matrix math runs in each precision, measured per GPU architecture (docs/busy-gpu.md).

Measured on an H100 80GB HBM3 (torch 2.11, CUDA 13, cuBLAS/cuDNN as shipped) with
programs/busy/matmul_bench.py: TFLOP/s of the GEMMs of a GPT-2-small step (8192x768 @ 768x3072 and its
siblings) and of a ResNet 3x3 convolution (256 channels, 56x56, batch 128, channels_last), in fp32 with TF32
off, TF32, and bf16. The ratios below are the smallest seen over those shapes. Misaligned GEMMs (CUTLASS
``align1`` kernels, e.g. an LM head over a vocabulary of 50257) were not measured and may gain less.
Elementwise kernels: ResNet-50 channels_last, nsys captures in fp32 and under bf16 autocast, 12.64 -> 8.83 ms
a step (1.43x; half the bytes, but some stay fp32); batch norm did not change (13.18 -> 14.04 ms). H200 has
the same tensor cores (sm90). Other GPUs are not measured yet: the H100 ratios are used and the prediction
says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import ms, pct


@dataclass(frozen=True)
class Ratios:
    measured_on: str
    elementwise_fp32_to_bf16: float  # elementwise kernels once autocast makes the activations bf16
    gemm_fp32_to_tf32: float
    gemm_fp32_to_bf16: float
    gemm_tf32_to_bf16: float
    conv_fp32_to_tf32: float
    conv_fp32_to_bf16: float
    conv_tf32_to_bf16: float


H100 = Ratios("H100", elementwise_fp32_to_bf16=1.4, gemm_fp32_to_tf32=4.8, gemm_fp32_to_bf16=9.9, gemm_tf32_to_bf16=1.9,
              conv_fp32_to_tf32=9.0, conv_fp32_to_bf16=17.1, conv_tf32_to_bf16=1.9)
BY_ARCH = {"H100": H100, "H200": H100}


def ratios_for(gpu_names: list[str]) -> tuple[Ratios, bool]:
    """The ratios of the report's GPU, and whether they were measured on that architecture."""
    for name in gpu_names:
        for arch, r in BY_ARCH.items():
            if arch in (name or ""):
                return r, True
    return H100, False


FP32 = ("gemm_fp32", "conv_fp32")
TF32 = ("gemm_tf32", "conv_tf32")
LOW = ("gemm_bf16", "gemm_fp16", "gemm_fp8", "conv_bf16", "conv_fp16", "conv_fp8")
UNSTATED = ("gemm", "conv")  # math not stated in the names: counted as matrix math, not as fp32
TF32_FIX = ("torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high'), which covers "
            "matmuls only) and torch.backends.cudnn.allow_tf32 = True (the default, for convolutions) at the start "
            "of the script")
BF16_FIX = ("run the forward and the loss under torch.autocast(device_type='cuda', dtype=torch.bfloat16) "
            "(Hugging Face Trainer: bf16=True; Lightning: precision='bf16-mixed'); no GradScaler is needed for bf16")


def _findings(analysis, basis) -> list[Finding]:
    k = analysis.kernels
    if k is None or not k.compute_ns:
        return []
    fp32, tf32, low = k.time(*FP32), k.time(*TF32), k.time(*LOW)
    matrix = fp32 + tf32 + low + k.time(*UNSTATED)
    if not matrix or low >= THRESHOLDS["precision_low_share"] * matrix:
        return []  # already in reduced precision: nothing to gain here
    ratios, measured = ratios_for([d.name for d in analysis.idle.devices] if analysis.idle else [])
    on = "" if measured else f", not measured on this GPU: {ratios.measured_on}'s"
    step = k.per_step
    share = THRESHOLDS["precision_share"] * k.compute_ns
    if fp32 >= share and fp32 >= THRESHOLDS["min_impact_ns"]:
        gemm, conv = k.time("gemm_fp32"), k.time("conv_fp32")
        saved = gemm * (1 - 1 / ratios.gemm_fp32_to_tf32) + conv * (1 - 1 / ratios.conv_fp32_to_tf32)
        bf16_left = gemm / ratios.gemm_fp32_to_bf16 + conv / ratios.conv_fp32_to_bf16
        title = (f"Matrix math in fp32 on CUDA cores, without tensor cores: {ms(fp32)} of GPU time "
                 f"({pct(fp32 / k.compute_ns)} of the GPU's compute in the window) in fp32 GEMMs/convolutions"
                 + (f", {ms(step(fp32))} a step" if k.steps else ""))
        fix = (f"Turn on TF32: {TF32_FIX}; tensor cores then run these GEMMs about {ratios.gemm_fp32_to_tf32:.1f}x "
               f"faster, with fp32 range and a 10-bit mantissa. Then, for about {ratios.gemm_fp32_to_bf16:.1f}x over "
               f"fp32: {BF16_FIX}. Both change numerics slightly: compare the loss of the first steps")
        what = (f"{ms(step(saved))} of fp32 GEMM/convolution time per step goes with TF32 (fp32->TF32 "
                f"{ratios.gemm_fp32_to_tf32:.1f}x GEMM, {ratios.conv_fp32_to_tf32:.1f}x convolution, the smallest "
                f"ratios measured on {ratios.measured_on}{on}; bf16 would leave {ms(step(bf16_left))})"
                ) if k.steps else ""
        impact, recommend = fp32, {"tf32": True, "amp": "bf16"}
    elif tf32 >= share and tf32 >= THRESHOLDS["min_impact_ns"]:
        gemm, conv, elementwise = k.time("gemm_tf32"), k.time("conv_tf32"), k.time("elementwise")
        matrix_saved = gemm * (1 - 1 / ratios.gemm_tf32_to_bf16) + conv * (1 - 1 / ratios.conv_tf32_to_bf16)
        saved = matrix_saved + elementwise * (1 - 1 / ratios.elementwise_fp32_to_bf16)
        title = (f"Matrix math in TF32: {ms(tf32)} of GPU time ({pct(tf32 / k.compute_ns)} of the GPU's compute in "
                 "the window) in TF32 GEMMs/convolutions" + (f", {ms(step(tf32))} a step" if k.steps else "")
                 + "; bf16 tensor cores are about twice as fast and bf16 activations halve the bytes moved")
        fix = f"Use bf16 mixed precision: {BF16_FIX}. It changes numerics slightly: compare the loss of the first steps"
        what = (f"{ms(step(matrix_saved))} of TF32 GEMM/convolution time per step goes in bf16 (TF32->bf16 "
                f"{ratios.gemm_tf32_to_bf16:.1f}x) and {ms(step(saved - matrix_saved))} of elementwise time (bf16 "
                f"activations, {ratios.elementwise_fp32_to_bf16:.1f}x; ratios measured on {ratios.measured_on}{on})"
                ) if k.steps else ""
        impact, recommend = tf32, {"amp": "bf16"}
    else:
        return []
    predicted = predict.gpu_work_saved(analysis, step(saved), what) if k.steps else None
    return [Finding(
        kind="precision", title=title, impact_ns=int(impact),
        fix=predict.with_expected(fix, predicted) if predicted else fix + predict.not_gpu_bound(analysis),
        recommend=recommend, predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['precision_share'])} of the GPU's compute in the window in fp32 or TF32 matrix "
                  f"math, and bf16/fp16 < {pct(THRESHOLDS['precision_low_share'])} of the matrix math",
        evidence={"facts": facts(analysis), "fp32_ns": fp32, "tf32_ns": tf32, "bf16_fp16_fp8_ns": low,
                  "compute_ns": k.compute_ns,
                  "ratios": ratios.__dict__ | {"measured_on_this_gpu": measured},
                  "kernels": k.by_name[k.by_name["category"].isin(FP32 + TF32)].head(10)},
    )]


QUESTION = Question(
    name="precision", order=115, needs=("kernels", "steps", "settings"),
    thresholds={"precision_share": 0.10,  # fp32/TF32 matrix math at 10 % of the GPU's compute in the window
                "precision_low_share": 0.5},  # no finding once half the matrix math is bf16/fp16 already
    findings=_findings, work_kinds=("precision",),
    # its prediction is for the first step of its fix (TF32 from fp32): `try` applies that step alone
    knobs={"precision": lambda finding, named: dict([next(iter(named.items()))]) if named else named},
)
