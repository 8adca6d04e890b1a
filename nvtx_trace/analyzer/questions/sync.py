"""Where does the host block on the GPU, and how much GPU idle follows?

Blocking host syncs (``.item()``, ``.cpu()``, ``cudaStreamSynchronize`` ...) and where they come from.

A sync is not slow by itself (the GPU is busy meanwhile); its cost is that the
CPU stops queueing work, so the GPU runs dry and then waits for Python. That
idle time is measured in gpu_idle as the "sync" cause; here we list the calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from nvtx_trace import names
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.allocator_calls import FREE_RE, freed_ns
from nvtx_trace.analyzer.measures.gpu_idle import CAUSE_FIXES
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.analyzer.trace.attribution import attribute, range_labels
from nvtx_trace.analyzer.trace.tables import SYNC_API_RE, Trace
from nvtx_trace.units import ms, pct


@dataclass
class SyncResult:
    calls: pd.DataFrame  # start_ns, end_ns, gtid, pid, name, range (the innermost NVTX range around each)
    by_source: pd.DataFrame  # api, range, count, blocked_ns
    per_step: dict = field(default_factory=dict, repr=False)  # locations()/implicit() of one window, made once

    @property
    def wait_set(self) -> iv.Set:
        return iv.union(self.calls["start_ns"].to_numpy(), self.calls["end_ns"].to_numpy())

    @property
    def count(self) -> int:
        return int(len(self.calls))

    @property
    def blocked_ns(self) -> int:
        return iv.total(self.wait_set)


def _of(sync: SyncResult, window: tuple[int, int] | None, pid: int | None) -> pd.DataFrame:
    """The sync calls begun in ``window`` by process ``pid`` (either None: all)."""
    calls = sync.calls
    if window is not None:
        calls = calls[(calls["start_ns"] >= window[0]) & (calls["start_ns"] < window[1])]
    if pid is not None and "pid" in calls:
        calls = calls[calls["pid"] == pid]
    return calls


def locations(sync: SyncResult, window: tuple[int, int] | None, steps: int, pid: int | None = None) -> pd.DataFrame:
    """The lines that asked for a sync (nvtx_autotrace's ``sync WHAT at FILE:LINE`` ranges), in the window of
    the training process: what, where, calls and the time the host was blocked, per steady step; largest
    first. Empty without such ranges (captured before they named their line, or not under nvtx_autotrace)."""
    cols = ["what", "where", "count_per_step", "blocked_ns_per_step"]
    calls = _of(sync, window, pid)
    found = calls["range"].astype(str).str.extract(names.SYNC_SITE_RE) if len(calls) else None
    if found is None or found["where"].isna().all() or steps <= 0:
        return pd.DataFrame(columns=cols)
    rows = pd.DataFrame({"what": found["what"], "where": found["where"],
                         "blocked": (calls["end_ns"] - calls["start_ns"]).to_numpy()}).dropna(subset=["where"])
    out = rows.groupby(["what", "where"], as_index=False).agg(count=("blocked", "size"), blocked=("blocked", "sum"))
    out["count_per_step"] = out["count"] / steps
    out["blocked_ns_per_step"] = out["blocked"] / steps
    return out.sort_values("blocked_ns_per_step", ascending=False, ignore_index=True)[cols]


def implicit(sync: SyncResult, window: tuple[int, int] | None, steps: int, pid: int | None = None) -> pd.DataFrame:
    """The blocking calls no wrapper named (``data[mask]``, ``nonzero``, one-argument ``torch.where``, a
    library's own ``cudaStreamSynchronize``): no Python line, so the innermost range they ran in, per steady step;
    largest first. Calls inside nvtx_autotrace's sync and copy ranges, and cudaFree (the allocator's), are not
    these. Empty without sync-site ranges in the report: there every call would be implicit."""
    cols = ["api", "range", "count_per_step", "blocked_ns_per_step"]
    calls = _of(sync, window, pid)
    labels = calls["range"].astype(str)
    if steps <= 0 or not labels.str.match(names.SYNC_SITE_RE).any():
        return pd.DataFrame(columns=cols)
    named = labels.str.match(names.SYNC_RE) | labels.str.startswith(("copy.", "pin_memory"))
    api = calls["name"].astype(str)
    keep = ~named & ~api.str.match(r"^(cudaFree|cuMemFree)")
    rows = pd.DataFrame({"api": api[keep].str.replace(r"_v\d+$", "", regex=True), "range": labels[keep],
                         "blocked": (calls["end_ns"] - calls["start_ns"])[keep]})
    if not len(rows):
        return pd.DataFrame(columns=cols)
    out = rows.groupby(["api", "range"], as_index=False).agg(count=("blocked", "size"), blocked=("blocked", "sum"))
    out["count_per_step"] = out["count"] / steps
    out["blocked_ns_per_step"] = out["blocked"] / steps
    return out.sort_values("blocked_ns_per_step", ascending=False, ignore_index=True)[cols]


def analyze_sync(trace: Trace) -> SyncResult:
    calls = trace.api_calls(SYNC_API_RE)
    calls = calls.sort_values("start_ns", ignore_index=True)
    ranges = trace.ranges
    idx, _ = attribute(calls["start_ns"].to_numpy(), calls["gtid"].to_numpy(), calls["pid"].to_numpy(), ranges) \
        if len(calls) else (np.empty(0, np.int64), None)
    labels = range_labels(ranges, idx)
    calls = calls.assign(range=labels)
    df = pd.DataFrame({"api": calls["name"].astype(str).to_numpy(),
                       "range": labels,
                       "blocked_ns": (calls["end_ns"] - calls["start_ns"]).to_numpy()})
    by_source = df.groupby(["api", "range"], as_index=False).agg(count=("blocked_ns", "size"),
                                                                 blocked_ns=("blocked_ns", "sum"))
    return SyncResult(calls=calls, by_source=by_source.sort_values("blocked_ns", ascending=False, ignore_index=True))


LINE_FIXES = {  # what to do at the line, by what read the GPU's result there
    "cuda.synchronize": "take torch.cuda.synchronize() out of the loop (time with CUDA events)",
}
READ_FIX = "keep the tensor on the GPU and read it every N steps"


def _run(ctx: Context) -> None:
    analysis = ctx.result
    analysis.sync = analyze_sync(ctx.trace) if ctx.reader.has_cuda_api() else None
    if analysis.sync is None:
        analysis.skipped.setdefault("sync", ctx.trace.info.why_missing("Cuda", "CUDA", "CUDA API calls", "-t cuda"))
        if analysis.idle:
            ctx.trace.warnings.append("the report has GPU activity but no CUDA API calls: host syncs, blocking "
                                      "copies and which module launched a kernel cannot be measured")


def _per_step(analysis, how):
    """``how`` (locations or implicit) of the training process's steady steps, made once per analysis."""
    steps = len(analysis.steps.steady) if analysis.steps else 0
    window = (analysis.window["start_ns"], analysis.window["end_ns"]) if analysis.window else None
    pid = analysis.steps.pid if analysis.steps else None
    key = (how.__name__, window, steps, pid)
    if key not in analysis.sync.per_step:
        analysis.sync.per_step[key] = how(analysis.sync, window, steps, pid)
    return analysis.sync.per_step[key]


def _lines(analysis):
    """The sync ranges' lines (nvtx_autotrace names them), per steady step of the training process."""
    return _per_step(analysis, locations)


def _implicit(analysis):
    """The blocking calls no wrapper named, per steady step of the training process, by innermost range."""
    return _per_step(analysis, implicit)


def _json(analysis) -> dict:
    if not analysis.sync:
        return {"sync": None}
    return {"sync": {"count": analysis.sync.count, "blocked_ns": analysis.sync.blocked_ns, "sources": analysis.sync.by_source,
                     "locations": _lines(analysis), "implicit": _implicit(analysis)}}


def _implicit_words(rows) -> str:
    """The largest implicit sync, said with where it ran, for the finding's title."""
    if not len(rows) or rows["blocked_ns_per_step"].iloc[0] < IMPLICIT_SAID_NS:
        return ""
    r = rows.iloc[0]
    return (f"; with no line (an implicit sync: data[mask], nonzero, torch.where(cond), a library's, code "
            f"torch.compile compiled): {r['api']} "
            f"in {r['range']}: {ms(r['blocked_ns_per_step'])} a step, {r['count_per_step']:.3g} a step")


IMPLICIT_SAID_NS = 1_000  # an implicit sync blocking the host under 1 us a step is not worth a user's search


def _line_words(row) -> str:
    return (f"{row['what']} at {row['where']}: {ms(row['blocked_ns_per_step'])} a step, "
            f"{row['count_per_step']:.3g} a step: {LINE_FIXES.get(row['what'], READ_FIX)}")


def short_idle_after_syncs(analysis) -> dict[int, int]:
    """Per GPU of the training process: its idle in gaps shorter than --min-gap-ms that opened while the training
    thread waited in a sync call (the queue drained as the host waited; the gap lasts until the host's next launch
    reaches the GPU). A sync every step costs that much a step, and no long gap shows it (an .item() a step on a
    3.5-ms step: 0.7 ms). Gaps of --min-gap-ms or more are the idle analysis's, by cause."""
    if not analysis.sync or not analysis.idle or not analysis.window or not analysis.steps or not len(analysis.sync.calls):
        return {}
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]
    calls = analysis.sync.calls
    calls = calls[(calls["pid"] == analysis.steps.pid) & (calls["end_ns"] > w0) & (calls["start_ns"] < w1)]
    calls = calls.sort_values("start_ns")
    c0, c1 = calls["start_ns"].to_numpy(np.int64), calls["end_ns"].to_numpy(np.int64)
    out = {}
    for dev in analysis.idle.devices:
        if analysis.steps.pid not in (dev.pids or ()) or not len(c0):
            continue
        h0, h1 = iv.holes(dev.busy, min_len=1)
        keep = (h1 - h0 < analysis.min_gap_ns) & (h1 > w0) & (h0 < w1)
        h0, h1 = h0[keep], h1[keep]
        at = np.searchsorted(c0, h0, side="right") - 1  # the last sync call begun before the gap opened
        opened = (at >= 0) & (h0 <= c1[np.maximum(at, 0)])
        out[dev.device_id] = int((np.minimum(h1, w1) - np.maximum(h0, w0))[opened].sum())
    return out


def _findings(analysis, basis) -> list[Finding]:
    if not analysis.sync or not analysis.sync.count:
        return []
    freed = freed_ns(analysis.allocator, basis.gpu_ns, THRESHOLDS)  # the allocator finding counts it, where raised
    short = short_idle_after_syncs(analysis) if len(_lines(analysis)) else {}  # the per-step syncs of lines we can name
    idle_ns = max(0, basis.cause_ns.get("sync", 0) - freed) + sum(short.values())
    if idle_ns < THRESHOLDS["min_impact_ns"] or idle_ns < THRESHOLDS["cause_fraction"] * basis.gpu_ns:
        return []
    src = analysis.sync.by_source
    if freed:
        src = src[~src["api"].map(lambda n: bool(FREE_RE.match(n)))]
    src = src.head(3)
    where = "; ".join(f"{api} in {r} (x{c})" for api, r, c in zip(src["api"], src["range"], src["count"]))
    lines = _lines(analysis)
    if len(lines):  # the user's lines, each with its time and its fix
        where = "; ".join(_line_words(r) for _, r in lines.head(3).iterrows()) + _implicit_words(_implicit(analysis))
    return [Finding(
        kind="sync", title=f"Host syncs let the GPU run dry: {ms(idle_ns)} idle after syncs"
                           + (f" ({ms(sum(short.values()))} of it in gaps under {ms(analysis.min_gap_ns)})"
                              if sum(short.values()) else "")
                           + (" (cudaFree's left to the allocator finding)" if freed else "") + f"; top: {where}",
        impact_ns=int(idle_ns), fix=CAUSE_FIXES["sync"],
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
        evidence={"sources": analysis.sync.by_source.head(20), "count": analysis.sync.count,
                  "blocked_ns": analysis.sync.blocked_ns,
                  "locations": lines.head(20), "short_idle_ns": short},
    )]


def _text(analysis, view) -> None:
    """The lines that asked for a sync, each with its time and count a step (found or not: a user hunting an
    .item() wants the line even where the GPU lost little to it)."""
    if not analysis.sync:
        return
    lines = _lines(analysis)
    if len(lines):
        view.print("Host syncs by line (a steady step's time blocked in them, and calls a step): "
                   + "; ".join(f"{r['what']} at {r['where']} {ms(r['blocked_ns_per_step'])}, {r['count_per_step']:.3g}"
                               for _, r in lines.head(5).iterrows()), highlight=False, markup=False)


def _html(analysis, d: dict, view) -> str:
    lines = _lines(analysis) if analysis.sync else None
    by_line = ""
    if lines is not None and len(lines):
        by_line = view.table(lines.head(20), "Host syncs by line (a steady step's time blocked in them)",
                                   {"what": "call", "where": "line", "count_per_step": "calls a step",
                                    "blocked_ns_per_step": "CPU blocked a step"},
                                   folder=(analysis.settings or {}).get("cwd"))
    return by_line + view.table(analysis.tables.get("sync_sources"), "Host syncs (CPU blocked until the GPU caught up)",
                                {"api": "CUDA call", "range": "NVTX range", "count": "calls",
                                 "blocked_ns": "CPU blocked"})


QUESTION = Question(
    name="sync", order=60, run=_run, needs=("idle",),
    findings=_findings, idle_kinds=("sync",),
    json_keys=("sync",), json_at=100, to_json=_json,
    tables=lambda analysis: {"sync_sources": analysis.sync.by_source} if analysis.sync else {},
    text=_text, text_at=55, html=_html, html_at=50,
)
