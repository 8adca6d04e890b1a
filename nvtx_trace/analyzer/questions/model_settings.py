"""Settings the record shows that cost time or memory for nothing: DataParallel instead of DDP, cudnn.benchmark off
with fixed-shape convolutions, a convolution's bias right before a batch norm.

Only the settings record tells these apart (kernel names do not), so a plain nsys capture gets none of them.
None is predicted: on one GPU DataParallel costs nothing measurable, cudnn.benchmark may or may not find a
faster algorithm than cuDNN's heuristics (only a run with it on says), and a bias before batch norm costs one
small add and its gradient per convolution.
"""

from __future__ import annotations

from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.provenance import RECORDED
from nvtx_trace.analyzer.question import Question
from nvtx_trace.units import pct

CONV = ("conv_fp32", "conv_tf32", "conv_bf16", "conv_fp16", "conv_fp8", "conv")


def _findings(analysis, basis) -> list[Finding]:
    s = analysis.settings
    if not s:
        return []
    out = []
    if "DataParallel" in (s.get("wrappers") or []):
        out.append(Finding(
            kind="data_parallel",
            title="The model is wrapped in torch.nn.DataParallel: one process drives every GPU, replicating the "
                  "model and scattering each batch every step from GPU 0",
            impact_ns=0,
            fix="Use DistributedDataParallel, one process per GPU (torchrun --nproc_per_node=N train.py; "
                "model = DDP(model, device_ids=[local_rank])); on one GPU, call the model itself (DataParallel still "
                "scatters each batch and gathers each output on the host: the knob no_data_parallel=1 does that "
                "without an edit). No prediction: its cost grows with the GPUs it drives.",
            recommend={"no_data_parallel": True}, threshold="a DataParallel instance alive (settings record)",
            evidence={"wrappers": s.get("wrappers"), "facts": RECORDED}))
    k = analysis.kernels
    conv = k.time(*CONV) if k is not None else 0
    if s.get("cudnn_benchmark") is False and k is not None and k.compute_ns \
            and conv >= THRESHOLDS["cudnn_benchmark_share"] * k.compute_ns:
        out.append(Finding(
            kind="cudnn_benchmark",
            title=f"cudnn.benchmark is off while convolutions take {pct(conv / k.compute_ns)} of the GPU's compute "
                  "in the window: cuDNN picks their algorithms by heuristics instead of timing them",
            impact_ns=0,
            fix="Set torch.backends.cudnn.benchmark = True at the start of the script when input shapes do not "
                "change from step to step (the first step of each new shape gets slower while it times the "
                "algorithms). No prediction: only a run with it on says whether a faster algorithm exists (on an "
                "H100 with cuDNN 9, ResNet-50 in bf16 gained nothing).",
            recommend={"cudnn_benchmark": True},
            threshold=f"cudnn.benchmark False (settings record) and convolutions >= "
                      f"{pct(THRESHOLDS['cudnn_benchmark_share'])} of the GPU's compute in the window",
            evidence={"conv_ns": conv, "compute_ns": k.compute_ns, "facts": RECORDED}))
    bias = s.get("conv_bias_before_bn") or {}
    if bias.get("count"):
        out.append(Finding(
            kind="conv_bias_before_bn",
            title=f"{bias['count']} convolution(s) have a bias right before a batch norm, which subtracts it again "
                  f"(e.g. {', '.join(bias.get('examples') or [])})",
            impact_ns=0,
            fix="Build those convolutions with bias=False: the batch norm's own shift replaces the bias, so the "
                "result is the same with one add, its gradient and its optimizer state fewer per convolution. "
                "No prediction: the saving is small.",
            recommend={"conv_bias": False}, threshold="a Conv with bias followed by a BatchNorm (settings record)",
            evidence={**bias, "facts": RECORDED}))
    return out


QUESTION = Question(
    name="model_settings", order=122, needs=("kernels", "settings"),
    thresholds={"cudnn_benchmark_share": 0.10},  # convolutions at 10 % of the GPU's compute in the window
    findings=_findings,
)
