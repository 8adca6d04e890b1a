"""What a kernel's name says it is, where more than one question asks: a layout transpose (the layout question
counts them, the kernels question keeps them apart), a tensor-core GEMM that reads one element at a time
(alignment, fusion); and why no GPU analysis can run on a report. A question imports no other question."""

from __future__ import annotations

import re

# Transpose kernels seen in cuDNN, PyTorch and TensorRT names; deliberately not the
# NHWC convolution kernels themselves (``..._nhwckrsc_nhwc_...``).
TRANSPOSE_RE = re.compile(
    r"(?i)(nchw_?(to|2)_?nhwc|nhwc_?(to|2)_?nchw|nchw(to|2)nhwc|nhwc(to|2)nchw"
    r"|(nchw|nhwc|nc\dhw\d*)_?(transpose|permute)|transpose_?(nchw|nhwc)"
    r"|convert_?(nchw|nhwc)_?(to|2)_?(nchw|nhwc))"
)

TRANSPOSE_HINTS = ("%nchw%", "%nhwc%", "%nc_hw%")  # every match of TRANSPOSE_RE contains one of these


def is_transpose(name: str) -> bool:
    return bool(TRANSPOSE_RE.search(name))


def gpu_missing(trace) -> str:
    """Why an analysis of GPU activity cannot run on this report."""
    return trace.info.why_missing("Cuda", "CUDA", "GPU activity (kernels, memory copies or memsets with valid times)",
                                  "-t cuda on a machine with a GPU")


MISALIGNED = re.compile(r"align[ac]?1(?!\d)")
# Measured on an H100 (programs/busy, bf16): the HF-style model's LM head over 50257 ran as three align1 GEMMs,
# 15.46 ms a step; the GPT program's over 50304, same shapes otherwise, about 2.5 ms: 6x. Padding the HF-style
# model's vocabulary to 50304 took its plain step from 46.6 to 34.0 ms (predicted 34.7 ms).
ALIGNED_RATIO = 6.0
TENSOR_CORE = ("gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp8")  # where that ratio was measured (bf16)


def misaligned_kernels(k):
    """(the tensor-core align1 GEMM kernels by name, their time) in the window."""
    names = k.by_name
    bad = names[names["category"].isin(TENSOR_CORE) & names["name"].str.contains(MISALIGNED)]
    return bad, int(bad["time_ns"].sum())


def saved_per_step(k, tensor_core_ns: int) -> float:
    """What aligned kernels would save per step of those misaligned tensor-core GEMMs."""
    return k.per_step(tensor_core_ns) * (1 - 1 / ALIGNED_RATIO)
