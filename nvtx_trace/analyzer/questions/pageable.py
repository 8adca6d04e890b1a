"""Which host-to-device copies come from pageable memory, and from where?"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.kernel_kinds import gpu_missing
from nvtx_trace.analyzer.measures.pageable_copies import analyze_pageable, launch_filter
from nvtx_trace.analyzer.measures.pageable_copies import per_step as per_step_pageable
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.units import ms, size


def _run(ctx: Context) -> None:
    if not ctx.trace.has_gpu_activity:
        ctx.result.skipped["pageable_h2d"] = gpu_missing(ctx.trace)
        return
    ctx.result.pageable = analyze_pageable(ctx.trace)
    if ctx.result.pageable is None:
        ctx.result.skipped["pageable_h2d"] = ("no host-to-device copy records with a source memory kind (the memcpy "
                                              "table, or its copyKind/srcKind column, is missing)")


def _json(analysis) -> dict:
    p = analysis.pageable
    if not p:
        return {"pageable_h2d": None}
    return {"pageable_h2d": {"count": p.count, "bytes": p.bytes, "time_ns": p.time_ns, "api_ns": p.api_ns,
                             "bandwidth_gbps": p.bandwidth_gbps, "pinned_count": p.pinned_count,
                             "pinned_bytes": p.pinned_bytes, "pinned_time_ns": p.pinned_time_ns,
                             "pinned_bandwidth_gbps": p.pinned_bandwidth_gbps, "sources": p.by_source}}


def _findings(analysis, basis) -> list[Finding]:
    p, scope = per_step_pageable(analysis)
    if not p or not p.count or p.bytes < THRESHOLDS["pageable_min_bytes"]:
        return []
    bw = f"{p.bandwidth_gbps:.1f} GB/s"
    if p.pinned_time_ns:
        bw += f" vs {p.pinned_bandwidth_gbps:.1f} GB/s for pinned copies in the same report"
    cost = max(p.api_ns, p.time_ns)
    src = p.by_source.head(3)
    where = "; ".join(f"{'the training step (no narrower range)' if r == 'step N' else r} via {api}"
                      for r, api in zip(src["range"], src["api"]))
    return [Finding(
        kind="pageable_h2d",
        title=f"{p.count} host-to-device copies from pageable memory {scope} ({size(p.bytes)}) took {ms(p.time_ns)} "
              f"on the GPU at {bw}, blocking the CPU {ms(p.api_ns)}; issued from {where}",
        impact_ns=int(cost),
        fix="Pin the source: DataLoader(pin_memory=True) (or tensor.pin_memory()) and copy with "
            "x.to(device, non_blocking=True).",
        threshold=f">= {size(THRESHOLDS['pageable_min_bytes'])} copied",
        evidence={"sources": p.by_source.head(20), "pageable_gbps": p.bandwidth_gbps,
                  "pinned_gbps": p.pinned_bandwidth_gbps},
    )]


def _html(analysis, d: dict, view) -> str:
    pg = d.get("pageable_h2d")
    if not pg or not pg["count"]:
        return ""
    return view.table(analysis.tables.get("pageable_sources"), "Host-to-device copies from pageable memory",
                      {"range": "NVTX range that issued them", "api": "CUDA call", "count": "copies", "bytes": "bytes",
                       "time_ns": "GPU time", "api_ns": "CPU blocked"},
                      f"{pg['count']:,} copies, {size(pg['bytes'])}, at {pg['bandwidth_gbps'] or 0:.1f} GB/s (pinned "
                      f"copies in this report: {pg['pinned_bandwidth_gbps'] or 0:.1f} GB/s).")


def _predicted(analysis, f: Finding) -> dict | None:
    per_step = predict.work_per_step(analysis, f.impact_ns)  # measured over the steady steps, as every finding is
    return predict.work_removed(analysis, per_step, f"{ms(per_step)} of pageable copying per step goes")


QUESTION = Question(
    name="pageable", order=40, run=_run, launches=launch_filter,
    thresholds={"pageable_min_bytes": 1 << 20},  # ignore a few tiny pageable copies (scalars, shapes)
    findings=_findings, predicts={"pageable_h2d": _predicted},
    knobs={"pageable_h2d": lambda finding, named: named or {"pin_memory": True}},
    json_keys=("pageable_h2d",), json_at=90, to_json=_json,
    tables=lambda analysis: {"pageable_sources": analysis.pageable.by_source} if analysis.pageable else {},
    html=_html, html_at=40,
)
