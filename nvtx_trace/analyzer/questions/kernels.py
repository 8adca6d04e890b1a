"""What does the GPU do while it is busy? GPU time in the steady window by kind of work (the kernel mix).

Every kernel, copy and memset that starts in the window is counted once, by its own duration (kernels of
several streams may overlap, so shares are of GPU work time, not of wall time). Categories follow
analyzer/questions/kernels.py (docs/kernel-categories.md); names that say nothing are judged by their
demangled form, which the kernel table's one pass brings for those names only.

What kind of work a kernel does, from its name: the documented rules of docs/kernel-categories.md.

Rules are tried in order on the kernel's short name; a short name that says nothing (cuBLAS/CUTLASS's
``Kernel``/``Kernel2``) is judged by its demangled name, whose template argument names the math
(``cutlass::Kernel2<cutlass_80_simt_sgemm_...>`` is an fp32 GEMM on CUDA cores). GEMMs and convolutions
are split by the math their names state: fp32 on CUDA cores, TF32, bf16 or fp16 tensor cores, fp8.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from nvtx_trace.analyzer.measures.collectives import COMM_KERNEL_RE
from nvtx_trace.analyzer.measures.kernel_kinds import gpu_missing, is_transpose
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace.tables import GPU_OP_KINDS
from nvtx_trace.units import ms, pct

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


TOP = 15  # kernels (and the copy and memset rows) listed by name
KIND_CATEGORY = {GPU_OP_KINDS.index(k): k for k in ("memcpy", "memset")}  # gpu_ops kind codes of copies and memsets
NOT_COMPUTE = ("collective", "memcpy", "memset")  # busy, but not the computation the findings judge
PERSISTENT = ("gemm", "conv", "attention", "triton")  # categories whose kernels may be persistent (few blocks by design)


def _run(ctx: Context) -> None:
    analysis = ctx.result
    if not ctx.trace.has_gpu_activity:
        analysis.skipped["kernels"] = gpu_missing(ctx.trace)
        return
    ops = ctx.trace.gpu_ops
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    ops = ops[(ops["start_ns"] >= w0) & (ops["start_ns"] < w1)]
    duration = (ops["end_ns"] - ops["start_ns"]).to_numpy()
    kind = ops["kind"].to_numpy()
    rows = []
    for code, cat in KIND_CATEGORY.items():
        mine = kind == code
        if mine.any():
            rows.append({"name": LABELS[cat], "category": cat, "count": int(mine.sum()),
                         "time_ns": int(duration[mine].sum())})
    kernels = pd.DataFrame({"name_id": ops["name_id"].to_numpy()[kind == 0], "time_ns": duration[kind == 0]})
    by_id = kernels.groupby("name_id")["time_ns"].agg(["count", "sum"])
    names = ctx.reader.strings([i for i in by_id.index if i >= 0])
    split = _by_long_name(ctx, (w0, w1))
    for i, r in by_id.iterrows():
        if i in split:
            rows += split[i]
            continue
        short = names.get(i, "(unnamed kernel)")
        rows.append({"name": short, "category": category(short), "count": int(r["count"]), "time_ns": int(r["sum"])})
    steps = len(analysis.steps.steady) if analysis.steps and analysis.window.get("source", "").startswith("steady") else 0
    analysis.kernels = KernelMix(pd.DataFrame(rows, columns=["name", "category", "count", "time_ns"]), steps,
                                 max(1, len(analysis.idle.devices) if analysis.idle else 1))
    small = ctx.trace.rows("under_one_wave")
    if small is not None:
        collective = [i for i, n in names.items() if category(n) in NOT_COMPUTE]  # NCCL runs few blocks by design
        inside = (small["start_ns"] >= w0) & (small["start_ns"] < w1) & ~np.isin(small["name_id"], collective)
        # GEMM, convolution and attention libraries launch persistent kernels (one block per SM or fewer, each
        # looping over tiles): few blocks there is no sign of a small problem
        matrix = [i for i, n in names.items() if category(n).startswith(PERSISTENT)]
        plain = inside & ~np.isin(small["name_id"], matrix)
        span = small["end_ns"] - small["start_ns"]
        analysis.kernels.under_one_wave = {"count": int(inside.sum()), "time_ns": int(span[inside].sum()),
                                           "non_matrix_count": int(plain.sum()), "non_matrix_time_ns": int(span[plain].sum())}


def _announce(trace) -> None:
    """Short names that say nothing (or not their math): their kernels bring their demangled names; kernels of
    fewer thread blocks than their GPU has SMs are picked out while the kernel table is read."""
    trace.want_long_names(trace.reader.string_ids(DEMANGLE_HINTS, NeedsDemangled))
    trace.want_rows("kernel", "under_one_wave", _under_one_wave)


def _under_one_wave(trace, cols: dict) -> dict | None:
    """start_ns, end_ns, device_id, name_id of the kernels launched with fewer thread blocks than their GPU has
    SMs; None where the export lacks grid sizes or SM counts."""
    if not ("blocks" in cols and cols["blocks"].dtype.kind in "iu" and (sms := trace.reader.sm_counts())):
        return None
    lookup = np.zeros(max(sms) + 1, np.int64)
    for d, n in sms.items():
        lookup[d] = n
    dev = cols["device_id"].astype(np.int64)
    known = (dev >= 0) & (dev < len(lookup))
    under = known & (cols["blocks"] < lookup[np.where(known, dev, 0)])
    return {c: cols[c][under] for c in ("start_ns", "end_ns", "device_id", "name_id")}


def _by_long_name(ctx: Context, window: tuple[int, int]) -> dict[int, list[dict]]:
    """Rows by demangled name for the kernels whose short name says nothing (read with the kernel table)."""
    df = ctx.trace.long_named_kernels()
    if df is None or not len(df):
        return {}
    df = df[(df["start_ns"] >= window[0]) & (df["start_ns"] < window[1])]
    df = df.assign(time_ns=df["end_ns"] - df["start_ns"])
    longs = ctx.reader.strings(pd.unique(df["long_id"]).tolist())
    shorts = ctx.reader.strings(pd.unique(df["name_id"]).tolist())
    out: dict[int, list[dict]] = {}
    for (short_id, long_id), g in df.groupby(["name_id", "long_id"]):
        short, long = shorts.get(int(short_id), ""), longs.get(int(long_id), "")
        out.setdefault(int(short_id), []).append({"name": shown_name(short, long), "category": category(short, long),
                                                  "count": len(g), "time_ns": int(g["time_ns"].sum())})
    return out


class KernelMix:
    """The window's GPU work by category and by kernel; ``steps``: steady steps it spans (0: no steps), over
    ``gpus`` GPUs (per-step figures are per GPU)."""

    def __init__(self, by_name: pd.DataFrame, steps: int, gpus: int = 1):
        self.steps, self.gpus = steps, gpus
        self.under_one_wave: dict | None = None  # kernels with fewer thread blocks than SMs (None: no grid sizes)
        self.time_ns = int(by_name["time_ns"].sum())
        total = max(self.time_ns, 1)
        by_name = by_name.groupby(["name", "category"], as_index=False)[["count", "time_ns"]].sum()
        self.by_name = by_name.sort_values(["time_ns", "name"], ascending=[False, True], ignore_index=True)
        self.by_name["share"] = self.by_name["time_ns"] / total
        cats = self.by_name.groupby("category", as_index=False)[["count", "time_ns"]].sum()
        cats = cats.sort_values(["time_ns", "category"], ascending=[False, True], ignore_index=True)
        cats.insert(1, "label", [LABELS[c] for c in cats["category"]])
        cats["time_ns_per_step"] = cats["time_ns"] / (steps * gpus) if steps else np.nan
        cats["share"] = cats["time_ns"] / total
        self.by_category = cats
        self.compute_ns = self.time_ns - self.time(*NOT_COMPUTE)  # what the busy-GPU findings judge

    def time(self, *categories: str) -> int:
        c = self.by_category
        return int(c.loc[c["category"].isin(categories), "time_ns"].sum())

    def share(self, *categories: str) -> float:
        c = self.by_category
        return float(c.loc[c["category"].isin(categories), "share"].sum())

    def per_step(self, ns: float) -> float | None:
        """GPU time per steady step and GPU; None without steps."""
        return ns / self.steps / self.gpus if self.steps else None


def _json(analysis) -> dict:
    k = analysis.kernels
    if k is None:
        return {"kernels": None}
    cats = k.by_category.astype(object)
    cats["time_ns_per_step"] = [None if pd.isna(v) else int(v) for v in k.by_category["time_ns_per_step"]]
    return {"kernels": {"time_ns": k.time_ns, "compute_ns": k.compute_ns, "steps": k.steps, "gpus": k.gpus,
                        "categories": cats, "top": k.by_name.head(TOP), "under_one_wave": k.under_one_wave}}


def _text(analysis, view) -> None:
    k = analysis.kernels
    if k is None or not k.time_ns:
        return
    rows = [[r.label, f"{int(r.count):,}", ms(r.time_ns_per_step) if k.steps else "-", pct(r.share)]
            for r in k.by_category.head(10).itertuples()]
    view.table(f"What the GPU does in the window: {ms(k.time_ns)} of GPU work"
               + (f", {ms(k.per_step(k.time_ns))} a step" + (" per GPU" if k.gpus > 1 else "") if k.steps else ""),
               [("kind of work", "left"), ("count", "right"), ("per step", "right"), ("share", "right")], rows)
    if k.under_one_wave and k.under_one_wave["count"]:
        w = k.under_one_wave
        view.print(f"Under one wave: {w['count']:,} kernels ({pct(w['time_ns'] / k.time_ns)} of the GPU work) ran "
                   "fewer thread blocks than the GPU has SMs", highlight=False)


def _html(analysis, d: dict, view) -> str:
    k = d.get("kernels")
    if not k or not k["time_ns"]:
        return ""
    t = analysis.tables
    return (view.table(t.get("kernel_categories"), "What the GPU does in the window (kernel mix)",
                       {"label": "kind of work", "count": "launches", "time_ns": "GPU time",
                        "time_ns_per_step": "per step", "share": "share of GPU work"},
                       f"{ms(k['time_ns'])} of GPU work in the steady window; categories follow the documented "
                       "kernel-name rules.")
            + view.table(t.get("kernels_by_name"), "Kernels by GPU time in the window",
                         {"name": "kernel", "category": "category", "count": "launches", "time_ns": "GPU time",
                          "share": "share of GPU work"}))


QUESTION = Question(
    name="kernels", order=105, run=_run, needs=("window", "steps"), announce=_announce,
    json_keys=("kernels",), json_at=115, to_json=_json,
    tables=lambda analysis: {"kernel_categories": analysis.kernels.by_category, "kernels_by_name": analysis.kernels.by_name}
    if analysis.kernels is not None else {},
    text=_text, text_at=85, html=_html, html_at=15,
)
