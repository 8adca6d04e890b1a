"""Where does the host block on the GPU, and how much GPU idle follows?"""

from __future__ import annotations

from nvtx_trace.analyzer.findings import CAUSE_FIXES, THRESHOLDS, Finding, ms, pct
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.sync import analyze_sync


def _run(ctx: Context) -> None:
    a = ctx.result
    a.sync = analyze_sync(ctx.trace) if ctx.reader.has_cuda_api() else None
    if a.sync is None:
        a.skipped.setdefault("sync", ctx.trace.info.why_missing("Cuda", "CUDA", "CUDA API calls", "-t cuda"))
        if a.idle:
            ctx.trace.warnings.append("the report has GPU activity but no CUDA API calls: host syncs, blocking "
                                      "copies and which module launched a kernel cannot be measured")


def _json(a) -> dict:
    if not a.sync:
        return {"sync": None}
    return {"sync": {"count": a.sync.count, "blocked_ns": a.sync.blocked_ns, "sources": a.sync.by_source}}


def _findings(a, basis) -> list[Finding]:
    from nvtx_trace.analyzer.questions.allocator import FREE_RE, freed_ns

    if not a.sync or not a.sync.count:
        return []
    freed = freed_ns(a, basis)  # cudaFree belongs to the allocator finding when it raises one
    idle_ns = max(0, basis.cause_ns.get("sync", 0) - freed)
    if idle_ns < THRESHOLDS["min_impact_ns"] or idle_ns < THRESHOLDS["cause_fraction"] * basis.gpu_ns:
        return []
    src = a.sync.by_source
    if freed:
        src = src[~src["api"].map(lambda n: bool(FREE_RE.match(n)))]
    src = src.head(3)
    where = "; ".join(f"{api} in {r} (x{c})" for api, r, c in zip(src["api"], src["range"], src["count"]))
    return [Finding(
        kind="sync", title=f"Host syncs let the GPU run dry: {ms(idle_ns)} idle after syncs"
                           + (" (cudaFree's left to the allocator finding)" if freed else "") + f"; top: {where}",
        impact_ns=int(idle_ns), fix=CAUSE_FIXES["sync"],
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
        evidence={"sources": a.sync.by_source.head(20), "count": a.sync.count, "blocked_ns": a.sync.blocked_ns},
    )]


def _html(a, d: dict, view) -> str:
    return view.table(a.tables.get("sync_sources"), "Host syncs (CPU blocked until the GPU caught up)",
                      {"api": "CUDA call", "range": "NVTX range", "count": "calls", "blocked_ns": "CPU blocked"})


QUESTION = Question(
    name="sync", order=60, run=_run, needs=("idle",),
    findings=_findings, idle_kinds=("sync",),
    json_keys=("sync",), json_at=100, to_json=_json,
    tables=lambda a: {"sync_sources": a.sync.by_source} if a.sync else {},
    html=_html, html_at=50,
)
