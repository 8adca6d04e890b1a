"""What kind of work a kernel does, from its name: the documented rules of docs/kernel-categories.md.

Rules are tried in order on the kernel's short name; a short name that says nothing (cuBLAS/CUTLASS's
``Kernel``/``Kernel2``) is judged by its demangled name, whose template argument names the math
(``cutlass::Kernel2<cutlass_80_simt_sgemm_...>`` is an fp32 GEMM on CUDA cores). GEMMs and convolutions
are split by the math their names state: fp32 on CUDA cores, TF32, bf16 or fp16 tensor cores, fp8.
"""

from __future__ import annotations

import re

from nvtx_trace.analyzer.layout import is_transpose
from nvtx_trace.analyzer.measures.collectives import COMM_KERNEL_RE

# category -> words shown to a reader
LABELS = {
    "gemm_fp32": "GEMM, fp32 on CUDA cores (no tensor cores)",
    "gemm_tf32": "GEMM, TF32 tensor cores",
    "gemm_bf16": "GEMM, bf16 tensor cores",
    "gemm_fp16": "GEMM, fp16 tensor cores",
    "gemm_fp8": "GEMM, fp8 tensor cores",
    "gemm": "GEMM, math not stated in the name",
    "conv_fp32": "convolution, fp32 on CUDA cores (no tensor cores)",
    "conv_tf32": "convolution, TF32 tensor cores",
    "conv_bf16": "convolution, bf16 tensor cores",
    "conv_fp16": "convolution, fp16 tensor cores",
    "conv_fp8": "convolution, fp8 tensor cores",
    "conv": "convolution, math not stated in the name",
    "attention": "fused attention (flash, cuDNN SDPA)",
    "triton": "compiler-generated (Triton, torch.compile)",
    "batch_norm": "batch normalization",
    "norm_softmax": "layer/RMS normalization and softmax",
    "optimizer": "optimizer (multi-tensor / fused)",
    "reduction": "reductions",
    "elementwise": "elementwise and copies between dtypes",
    "layout_transpose": "NCHW <-> NHWC transposes",
    "collective": "collectives (NCCL)",
    "memcpy": "memory copies",
    "memset": "memsets and fills",
    "other": "other kernels",
}
GEMM_OR_CONV = tuple(k for k in LABELS if k.startswith(("gemm", "conv")))

# Generic short names that hide the kernel's identity: the demangled name decides.
OPAQUE = re.compile(r"^(Kernel\d*|kernel\d*|void|device_kernel|cutlass.*Kernel\d*)$")

_RULES: list[tuple[str, re.Pattern]] = [
    ("triton", re.compile(r"^triton_|^triton\b|_triton_", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|_sdpa_|sdpa_|mha_|efficient_attention|cudnn::fusion::|dot_do_o|"
                             r"convert_dq", re.I)),
    ("conv", re.compile(r"(?<![a-z])conv(?!ert)|Convolution|fprop|dgrad|wgrad|winograd|implicit_gemm|"
                        r"implicit_convolve|precomputed_convolve", re.I)),
    ("gemm", re.compile(r"gemm|gemv|nvjet|matmul|cublas|cutlass|xmma|wgmma|splitKreduce|s1688|s16816|h1688|h16816|"
                        r"bf16_s16816|i8816", re.I)),
    ("optimizer", re.compile(r"multi_tensor_apply|adam|_sgd|sgd_|(?<![a-z])lamb(?!da)|foreach|fused_optim", re.I)),
    ("batch_norm", re.compile(r"bn_fw|bn_bw|batch_norm|batchnorm|BatchNorm", re.I)),
    ("norm_softmax", re.compile(r"norm|softmax|welford|GammaBeta|rms|cuComputeGrad|cuApplyLayerNorm|cuApplyRMSNorm", re.I)),
    ("reduction", re.compile(r"reduce|reduction|cub::|DeviceRadix|DeviceScan|scan_|argmax|argmin|topk|sort", re.I)),
    ("memset", re.compile(r"fill|memset|zero_", re.I)),
    ("elementwise", re.compile(r"elementwise|CatArray|copy|index|gather|scatter|where|dropout|gelu|relu|silu|"
                               r"activation|embedding|pool|upsample|clamp|masked|tanh|sigmoid|pointwise", re.I)),
]

# The math a GEMM/convolution name states, tried in order: an element type the name spells out (bf16 before
# f16, tf32 before f32) before CUTLASS's instruction letters, where "s1688"/"s16816" alone mean TF32 tensor
# cores but "f16_s16816" means fp16 operands accumulated in fp32.
_MATH: list[tuple[str, re.Pattern]] = [
    ("fp8", re.compile(r"e4m3|e5m2|fp8|f8f8|_qgmma|nvjet_(?:sm\d+_)?[qe]", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16|nvjet_(?:sm\d+_)?t", re.I)),
    ("tf32", re.compile(r"tf32|tfloat32|nvjet_(?:sm\d+_)?x", re.I)),
    ("fp16", re.compile(r"f16|fp16|half|h884|h1688|h16816|hmma|tensorop_h|nvjet_(?:sm\d+_)?h", re.I)),
    ("tf32", re.compile(r"tensorop_s\d|_s1688|_s16816", re.I)),
    ("fp32", re.compile(r"ffma|simt|sgemm|f32f32_f32f32|implicit_convolve_sgemm|precomputed_convolve_sgemm", re.I)),
]

def category(short: str, demangled: str | None = None) -> str:
    """The category of one kernel (docs/kernel-categories.md): its short name decides unless it is opaque; the
    demangled name also states the math of a GEMM/convolution whose short name does not."""
    name = demangled if demangled and (OPAQUE.match(short or "") or not short) else short
    name = name or ""
    if COMM_KERNEL_RE.match(name):
        return "collective"
    if is_transpose(name):
        return "layout_transpose"
    for cat, rule in _RULES:
        if rule.search(name):
            if cat in ("gemm", "conv"):
                return cat + math_of(name, demangled)
            return cat
    return "other"


def math_of(name: str, demangled: str | None = None) -> str:
    """"_bf16", "_tf32", ... or "" when neither the name nor its demangled form states the math."""
    for text in (name, demangled or ""):
        for math, rule in _MATH:
            if rule.search(text):
                return "_" + math
    return ""


def shown_name(short: str, demangled: str | None) -> str:
    """The name a reader sees: the short name, unless it says nothing; then the demangled name's kernel and
    first template argument (``Kernel2<cutlass_80_simt_sgemm_128x64_8x5_tn_align1>``), at most 120 characters."""
    if not demangled or not (OPAQUE.match(short or "") or not short):
        return short
    name = demangled.removeprefix("void ").split("(", 1)[0]
    head, _, args = name.partition("<")
    head = head.rsplit("::", 1)[-1]
    first = re.split(r"[,<>]", args, maxsplit=1)[0].rsplit("::", 1)[-1].strip() if args else ""
    return (f"{head}<{first}>" if first else head)[:120]


def needs_demangled(short: str) -> bool:
    """A short name that says nothing, or a GEMM/convolution whose short name does not state its math."""
    return bool(OPAQUE.match(short or "")) or category(short) in ("gemm", "conv")


# SQL LIKE hints that find every such name among the report's strings (case-insensitive for ASCII)
DEMANGLE_HINTS = ("Kernel%", "void", "device_kernel", "cutlass%", "%gemm%", "%gemv%", "%conv%", "%xmma%", "%nvjet%", "%cublas%",
                  "%matmul%", "%splitK%", "%fprop%", "%dgrad%", "%wgrad%", "%wgmma%", "%winograd%", "%1688%",
                  "%16816%", "%8816%", "%implicit%", "%precomputed%")


class NeedsDemangled:
    """``reader.string_ids``'s pattern: a string matches when ``needs_demangled`` says so."""

    @staticmethod
    def search(name: str) -> bool:
        return needs_demangled(name)
