"""Do matrix multiplications and convolutions run in fp32 on CUDA cores (or TF32) where bf16 would do?

From the kernel mix: GEMM and convolution time by the math their kernel names state. fp32 on CUDA cores
-> TF32 (one line) and bf16 autocast; TF32 already -> bf16 autocast; a program whose matrix math is mostly
bf16/fp16 already gets no finding. The prediction takes the kernels that would change and divides their
time by the tensor-core speed ratio measured for the GPU (analyzer/tensor_cores.py); for bf16 autocast, the
elementwise kernels around them too (bf16 activations move half the bytes).
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding, ms, pct
from nvtx_trace.analyzer.question import Question
from nvtx_trace.analyzer.tensor_cores import ratios_for

FP32 = ("gemm_fp32", "conv_fp32")
TF32 = ("gemm_tf32", "conv_tf32")
LOW = ("gemm_bf16", "gemm_fp16", "gemm_fp8", "conv_bf16", "conv_fp16", "conv_fp8")
TF32_FIX = ("torch.backends.cuda.matmul.allow_tf32 = True and torch.backends.cudnn.allow_tf32 = True (or "
            "torch.set_float32_matmul_precision('high')) at the start of the script")
BF16_FIX = ("run the forward and the loss under torch.autocast(device_type='cuda', dtype=torch.bfloat16) "
            "(Hugging Face Trainer: bf16=True; Lightning: precision='bf16-mixed'); no GradScaler is needed for bf16")


def _time(k, cats) -> int:
    c = k.by_category
    return int(c.loc[c["category"].isin(cats), "time_ns"].sum())


def _findings(a, basis) -> list[Finding]:
    k = a.kernels
    if k is None or not k.time_ns:
        return []
    fp32, tf32, low = _time(k, FP32), _time(k, TF32), _time(k, LOW)
    matrix = fp32 + tf32 + low
    if not matrix or low >= THRESHOLDS["precision_low_share"] * matrix:
        return []  # already in reduced precision: nothing to gain here
    ratios, measured = ratios_for([d.name for d in a.idle.devices] if a.idle else [])
    on = "" if measured else f" (not measured on this GPU: {ratios.measured_on} ratios)"
    n_gpus = max(1, len(a.idle.devices) if a.idle else 1)
    per_step = (lambda ns: ns / k.steps / n_gpus) if k.steps else None
    gemm32, conv32 = _time(k, ("gemm_fp32",)), _time(k, ("conv_fp32",))
    gemm_t, conv_t = _time(k, ("gemm_tf32",)), _time(k, ("conv_tf32",))
    if fp32 >= THRESHOLDS["precision_share"] * k.time_ns and fp32 >= THRESHOLDS["min_impact_ns"]:
        saved = gemm32 * (1 - 1 / ratios.gemm_fp32_to_tf32) + conv32 * (1 - 1 / ratios.conv_fp32_to_tf32)
        then = (gemm32 / ratios.gemm_fp32_to_bf16 + conv32 / ratios.conv_fp32_to_bf16)
        title = (f"Matrix math in fp32 on CUDA cores, without tensor cores: {ms(fp32)} of GPU time "
                 f"({pct(fp32 / k.time_ns)} of the window's GPU work) in fp32 GEMMs/convolutions"
                 + (f", {ms(per_step(fp32))} a step" if per_step else ""))
        fix = (f"Turn on TF32: {TF32_FIX}; it runs these on tensor cores about {ratios.gemm_fp32_to_tf32:.1f}x "
               f"faster (GEMMs) with fp32 range and a 10-bit mantissa. Then, for about "
               f"{ratios.gemm_fp32_to_bf16:.1f}x over fp32: {BF16_FIX}. Both change numerics slightly: compare the "
               "loss of the first steps")
        what = (f"{ms(per_step(saved))} of fp32 GEMM/convolution time per step goes with TF32 (fp32->TF32 "
                f"{ratios.gemm_fp32_to_tf32:.1f}x GEMM, {ratios.conv_fp32_to_tf32:.1f}x convolution, measured on "
                f"{ratios.measured_on}{on}; a floor: bf16 would leave {ms(per_step(then))})") if per_step else ""
        impact, recommend = fp32, {"tf32": True, "amp": "bf16"}
    elif tf32 >= THRESHOLDS["precision_share"] * k.time_ns and tf32 >= THRESHOLDS["min_impact_ns"]:
        elementwise = _time(k, ("elementwise",))
        matrix_saved = gemm_t * (1 - 1 / ratios.gemm_tf32_to_bf16) + conv_t * (1 - 1 / ratios.conv_tf32_to_bf16)
        saved = matrix_saved + elementwise * (1 - 1 / ratios.elementwise_fp32_to_bf16)
        title = (f"Matrix math in TF32: {ms(tf32)} of GPU time ({pct(tf32 / k.time_ns)} of the window's GPU "
                 "work) in TF32 GEMMs/convolutions" + (f", {ms(per_step(tf32))} a step" if per_step else "")
                 + "; bf16 tensor cores are about twice as fast and halve the bytes moved")
        fix = f"Use bf16 mixed precision: {BF16_FIX}. It changes numerics slightly: compare the loss of the first steps"
        what = (f"{ms(per_step(matrix_saved))} of TF32 GEMM/convolution time per step goes in bf16 (TF32->bf16 "
                f"{ratios.gemm_tf32_to_bf16:.1f}x) and {ms(per_step(saved - matrix_saved))} of elementwise time (bf16 "
                f"activations, {ratios.elementwise_fp32_to_bf16:.1f}x; both measured on {ratios.measured_on}{on})"
                ) if per_step else ""
        impact, recommend = tf32, {"amp": "bf16"}
    else:
        return []
    predicted = predict.gpu_work_saved(a, per_step(saved), what) if per_step else None
    return [Finding(
        kind="precision", title=title, impact_ns=int(impact), fix=predict.with_expected(fix, predicted),
        recommend=recommend, predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['precision_share'])} of the window's GPU work in fp32 or TF32 matrix math, "
                  f"and bf16/fp16 < {pct(THRESHOLDS['precision_low_share'])} of it",
        evidence={"fp32_ns": fp32, "tf32_ns": tf32, "bf16_fp16_fp8_ns": low, "gpu_work_ns": k.time_ns,
                  "ratios": ratios.__dict__ | {"measured_on_this_gpu": measured},
                  "kernels": k.by_name[k.by_name["category"].isin(FP32 + TF32)].head(10)},
    )]


QUESTION = Question(
    name="precision", order=115, needs=("kernels", "steps"),
    thresholds={"precision_share": 0.10,  # fp32/TF32 matrix math at 10 % of the window's GPU work
                "precision_low_share": 0.5},  # no finding once half the matrix math is bf16/fp16 already
    findings=_findings, work_kinds=("precision",),
)
