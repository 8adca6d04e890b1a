"""How much faster matrix math runs in each precision, measured per GPU architecture (docs/busy-gpu.md).

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
