"""Dense peak FLOP/s of common training GPUs, by the math a step runs in: how far a program is from its limit.

From the vendors' datasheets, dense (not the "with sparsity" figures), SXM boards unless the name says
otherwise; tensor-core figures for TF32 and BF16 (FP16 is the same), CUDA-core figure for FP32. Matched by
the device name the settings record carries (``torch.cuda.get_device_properties().name``), first match wins.
"""

from __future__ import annotations

from nvtx_trace.knobs import PRECISIONS

FP32, TF32, BF16 = PRECISIONS  # the math a step runs in
TFLOPS = (  # (name contains, {precision: dense TFLOP/s})
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0}),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5}),
    ("H100", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    ("H200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    ("GH200", {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0}),
)


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """The dense peak for ``precision`` (fp32, tf32, bf16) on the named device; None for one not in the table."""
    if not device_name:
        return None
    for part, peaks in TFLOPS:
        if part in device_name and not (part == "A10" and "A100" in device_name) and not (
                part == "L4" and "L40" in device_name) and not (part == "H100" and "GH200" in device_name):
            return peaks.get(precision)
    return None


def precision_of(settings: dict, knobs: dict | None = None) -> str:
    """The math a step's matrix work runs in: bf16 under autocast, TF32 where allowed, else fp32; ``knobs`` (tune's
    configuration) make it what their declarations say (``Knob.precision``). A model whose FLOPs are mostly
    convolutions runs them in TF32 unless the program turned cuDNN's TF32 off: PyTorch's default allows it for
    convolutions (``torch.backends.cudnn.allow_tf32``), not for matmuls."""
    from nvtx_trace import knobs as declared

    made = declared.precision(knobs or {})
    if made == BF16 or any("bfloat16" in str(c.get("dtype")) or "float16" in str(c.get("dtype"))
                           for c in settings.get("autocast") or []):
        return BF16
    if made == TF32 or settings.get("matmul_allow_tf32") or settings.get("float32_matmul_precision") in (
            "high", "medium"):
        return TF32
    total, conv = settings.get("model_flops_per_step") or 0, settings.get("model_conv_flops_per_step") or 0
    if total and conv >= total / 2 and settings.get("cudnn_allow_tf32", True) is not False:
        return TF32
    return FP32


def achieved(flops_per_step: float, step_ms: float, device_name: str | None, precision: str) -> dict:
    """FLOP/s at a step time, and the share of the device's dense peak for that precision."""
    tflops = flops_per_step / (step_ms / 1e3) / 1e12
    peak = peak_tflops(device_name, precision)
    return {"tflops": round(tflops, 2), "precision": precision, "peak_tflops": peak,
            "peak_fraction": round(tflops / peak, 4) if peak else None}
