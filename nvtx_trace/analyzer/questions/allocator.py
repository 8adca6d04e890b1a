"""Does the training loop give GPU memory back and take it again every step (cudaFree / cudaMalloc)?

PyTorch's caching allocator keeps freed blocks for reuse, so a steady loop calls neither. Calls in the
steady window mean ``torch.cuda.empty_cache()`` in the loop (the settings record counts them), or shapes
that change every step and fragment the cache. Both calls block the training thread: cudaFree waits for
the whole GPU to finish, cudaMalloc for the driver. The prediction removes their time from the step (on an
H100, GPT-2 small with empty_cache() every step: 6.25 ms of calls a step under the profiler; without
empty_cache() the plain step went from 36.7 to 29.2 ms).
"""

from __future__ import annotations

import re

import numpy as np

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.allocator_calls import FREE_RE, churns
from nvtx_trace.analyzer.measures.provenance import facts
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.tables import SLOW_API_NS, SYNC_API_RE, api_base_name
from nvtx_trace.units import ms, pct

ALLOCATOR_API_RE = re.compile(r"^(cudaFree|cudaMalloc|cuMemFree|cuMemAlloc)(_v\d+)?$")


def _run(ctx: Context) -> None:
    analysis, trace = ctx.result, ctx.trace
    if not analysis.steps or not len(analysis.steps.steady) or not ctx.reader.has_cuda_api():
        return
    # cudaFree is loaded as a sync; cudaMalloc only when slow (>= SLOW_API_NS), which churn makes it
    calls = trace.api_calls(SYNC_API_RE, SLOW_API_NS)
    if not len(calls):
        return
    base = calls["name"].astype(str).map(api_base_name)
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    keep = (base.map(lambda n: bool(ALLOCATOR_API_RE.match(n))).to_numpy() & (calls["start_ns"].to_numpy() >= w0)
            & (calls["start_ns"].to_numpy() < w1) & (calls["pid"].to_numpy() == analysis.steps.pid))
    if not keep.any():
        return
    sel, names_ = calls[keep], base[keep]
    free = names_.map(lambda n: bool(FREE_RE.match(n))).to_numpy()
    dur = (sel["end_ns"] - sel["start_ns"]).to_numpy()
    analysis.allocator = {"calls": int(len(sel)), "frees": int(free.sum()), "mallocs": int((~free).sum()),
                          "time_ns": iv.total(iv.union(sel["start_ns"].to_numpy(), sel["end_ns"].to_numpy())),
                          "free_ns": int(np.sum(dur[free])), "malloc_ns": int(np.sum(dur[~free])),
                          "steps": len(analysis.steps.steady)}


def _findings(analysis, basis) -> list[Finding]:
    al = analysis.allocator
    if not churns(al, basis.gpu_ns, THRESHOLDS):
        return []
    t = al["time_ns"]
    per_step = t / al["steps"]
    recorded = (analysis.settings or {}).get("empty_cache_per_step")
    cause = (f"torch.cuda.empty_cache() runs {recorded:g} times a step (recorded)" if recorded else
             "the settings record counts no torch.cuda.empty_cache() call: shapes that change from step to step "
             "fragment the cache" if recorded == 0 else
             "torch.cuda.empty_cache() in the loop, or shapes that change every step")
    fix = ("Keep memory cached: remove torch.cuda.empty_cache() (and gc.collect() before it) from the training loop; "
           "if shapes vary, pad them to a few fixed sizes or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    predicted = predict.host_time_saved(analysis, per_step, f"the {ms(per_step)} per step the training thread spends in "
                                                     "cudaFree/cudaMalloc goes")
    return [Finding(
        kind="allocator",
        title=((f"GPU memory is freed and allocated again every step: {al['frees']} cudaFree and " if al["frees"] else
                "GPU memory is allocated anew in the steady state (no cudaFree: growing shapes, or a cache near the "
                "GPU's capacity): ") + f"{al['mallocs']} slow cudaMalloc calls in the window, {ms(t)} ({ms(per_step)} "
               f"a step) with the training thread blocked; likely cause: {cause}"),
        impact_ns=int(t), fix=predict.with_expected(fix, predicted) if predicted else fix + ".",
        recommend={"no_empty_cache": True}, predicted=predicted,
        threshold=f"cudaFree/cudaMalloc calls in the steady window at least every other step, >= "
                  f"{pct(THRESHOLDS['cause_fraction'])} of the window",
        evidence={**al, "empty_cache_per_step": recorded, "facts": facts(analysis)},
    )]


QUESTION = Question(
    name="allocator", order=85, run=_run, needs=("steps", "window", "settings"),
    findings=_findings, idle_kinds=("allocator",),
)
