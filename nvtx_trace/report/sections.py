"""Each analysis unit's part of the terminal report and of the HTML page's tables, by unit name.

A unit (analyzer/units.py) owns its JSON through ``to_json``; what it shows a reader lives here, in
``SECTIONS``, in the order a reader meets it. Renderers walk ``SECTIONS`` and compute nothing: a
section reads the unit's typed result (text) or the summary dict and the unit's tables (HTML).
Adding an analysis that shows something: one ``Section`` entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rich.markup import escape
from rich.table import Table

from nvtx_trace.analyzer.collectives import ALONE_PREFIX
from nvtx_trace.analyzer.findings import ms, pct, size
from nvtx_trace.analyzer.instrumentation import depth_text
from nvtx_trace.report.html_table import table


@dataclass(frozen=True)
class Section:
    text: Callable | None = None  # (Analysis, rich Console) -> None
    html: Callable | None = None  # (Analysis, summary dict) -> HTML of its tables ("" when nothing to show)


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


# ---------------------------------------------------------------- terminal

def _text_window(a, console) -> None:
    if a.window:
        span = a.window["end_ns"] - a.window["start_ns"]
        console.print(f"Window: {a.window['source']} ({ms(span)}); every figure below is measured in it unless "
                      "marked (trace): the whole trace", highlight=False)


def _text_idle(a, console) -> None:
    if not (a.idle and a.idle.devices):
        return
    t = Table(title="GPU activity", title_justify="left", show_edge=False)
    for col in ("GPU", "util.", "util. (trace)", "busy (trace)", f"gaps>={ms(a.min_gap_ns)} (trace)", "idle in them"):
        t.add_column(col, justify="right" if col != "GPU" else "left")
    for d in a.idle.devices:
        steady = a.window_utilization.get(d.device_id)
        t.add_row(f"{d.device_id} {d.name}", pct(steady) if steady is not None else "-", pct(d.utilization),
                  ms(d.busy_ns), str(d.gap_count), ms(d.gap_idle_ns))
    console.print(t)


def _text_communication(a, console) -> None:
    if a.communication is None:
        return
    t = Table(title="Communication (steady window): busy time that is not work", title_justify="left",
              show_edge=False)
    for col in ("GPU", "compute", "communication", "of it waiting for a peer", "overlapped"):
        t.add_column(col, justify="right")
    for d in a.communication.devices:
        wait = (ms(d.wait_ns) if d.wait_ns is not None else "unknown: no peer's report" if a.communication.alone
                else "unknown: collectives did not pair")
        t.add_row(str(d.device_id), ms(d.compute_ns), ms(d.communication_ns), wait, ms(d.overlap_ns))
    console.print(t)


def _text_steps(a, console) -> None:
    s = a.steps.summary() if a.steps else {}
    if not s:
        return
    unknown = any(s.get(f"{k}_fraction") is None for k in ("gpu_busy", "loader_wait", "sync_wait"))
    modes = s.get("modes")
    pace = (f"mean {ms(s['step_ns_mean'])}: steps come in two kinds, {modes['low_steps']} of about "
            f"{ms(modes['low_ns'])} and {modes['high_steps']} of about {ms(modes['high_ns'])} (a median, "
            f"{ms(s['step_ns_median'])}, would describe neither)" if modes else
            f"mean {ms(s['step_ns_mean'])}: uneven steps, a median of {ms(s['step_ns_median'])} hides the long ones, "
            f"p90 {ms(s['step_ns_p90'])}" if s.get("statistic") == "mean" else
            f"median {ms(s['step_ns_median'])}, p90 {ms(s['step_ns_p90'])}")
    console.print(
        f"Steps ({a.steps.how}): {s['steps']}, {s['warmup_steps']} of them warm-up; steady state {pace}. "
        f"Of step time: GPU busy {_pct(s['gpu_busy_fraction'])}" + _spinning(s) + ", waiting for data "
        f"{_pct(s['loader_wait_fraction'])}, in host syncs {_pct(s['sync_wait_fraction'])}"
        + (" (-: not captured)" if unknown else ""), highlight=False)


def _spinning(s: dict) -> str:
    """The part of busy time that is the GPU spinning in collectives until a peer arrives: waiting, not work."""
    spin = s.get("collective_wait_fraction")
    return f" ({_pct(spin)} of step time spinning in collectives for a peer)" if spin is not None and spin >= 0.01 else ""


def _text_startup(a, console) -> None:
    st = a.startup
    if st is None or st.duration_ns <= 0:
        return
    parts = ", ".join(f"{k} {ms(v)}" for k, v in list(st.parts.items())[:3])
    console.print(f"Start-up: {ms(st.duration_ns)} before the first step" + (f" (slow CUDA calls: {parts})"
                  if parts else "") + "; it happens once and is left out of every per-step figure",
                  highlight=False)


def _text_instrumentation(a, console) -> None:
    inst = a.instrumentation
    if not inst:
        return
    cost = "not measured" if inst.cost_ns_per_step is None else f"{ms(inst.cost_ns_per_step)} of CPU time per step"
    median = (a.steps.summary() or {}).get("step_ns_median") if a.steps else None
    share = f" ({pct(inst.cost_ns_per_step / median)} of the median step)" \
        if inst.cost_ns_per_step is not None and median else ""
    depth = depth_text(inst.settings)
    console.print(f"Instrumentation: {inst.ranges_per_step:.0f} nvtx_autotrace ranges per step, {cost}{share}"
                  + (f"; {depth}" if depth else ""), highlight=False)
    if inst.profiler_cost_ns_per_step is not None and median:
        console.print(f"Profiler: steps took {ms(inst.outside_capture_step_ns)} just before the capture and "
                      f"{ms(median)} inside it; {ms(inst.profiler_cost_ns_per_step)} a step "
                      f"({pct(inst.profiler_cost_ns_per_step / median)}) is nsys's own tracing, left out of "
                      "CPU-bound findings", highlight=False)


def _text_window_figures(a, console) -> None:
    if a.window_causes is not None and len(a.window_causes):
        t = Table(title="Why the GPU idles in the window", title_justify="left", show_edge=False)
        several = a.window_causes["device_id"].nunique() > 1
        for col in (["GPU"] if several else []) + ["cause", "idle", "of idle"]:
            t.add_column(col, justify="left" if col == "cause" else "right")
        for r in a.window_causes.itertuples():
            t.add_row(*([str(r.device_id)] if several else []), r.label, ms(r.idle_ns), pct(r.share))
        console.print(t)
    if a.gap_activity is None or not len(a.gap_activity):
        return
    several = a.gap_activity["device_id"].nunique() > 1
    t = Table(title="Largest gaps: what the CPU was doing ('at': time since the trace began)",
              title_justify="left", show_edge=False)
    for col in (["GPU"] if several else []) + ["at", "gap", "cause", "thread", "inside"]:
        t.add_column(col, justify="right" if col in ("GPU", "at", "gap") else "left")
    keys = ["device_id", "gap_start_ns", "gap_ns", "cause"]
    for shown, ((device, start, gap_ns, cause), rows) in enumerate(a.gap_activity.groupby(keys, sort=False)):
        if shown == 3:
            break
        for i, r in enumerate(rows.head(4).itertuples()):
            label = r.name if r.what == "nvtx" else f"CUDA {r.name}"
            first = i == 0
            t.add_row(*([str(device) if first else ""] if several else []),
                      ms(start - a.trace_start_ns) if first else "", ms(gap_ns) if first else "",
                      cause if first else "", escape(r.thread), escape(label))
    console.print(t)


def no_findings_line(warnings: list[str]) -> str:
    """"Nothing to fix", unless the report is one rank's whose busy time may be waiting for the others."""
    if any(w.startswith(ALONE_PREFIX) for w in warnings):
        return ("No findings above the thresholds in this one rank's report, but its time in collectives may be "
                f"waiting for other ranks (see the warning \"{ALONE_PREFIX} ...\").")
    return "No findings above the thresholds: nothing obvious to fix."


def _text_findings(a, console) -> None:
    if not a.findings:
        console.print(f"[green]{no_findings_line(a.warnings)}[/green]")
        return
    console.print("[bold]Findings[/bold] (biggest measured cost first)")
    for i, f in enumerate(a.findings, 1):
        console.print(f"{i}. [bold]{f.kind}[/bold] [red]{ms(f.impact_ns)}[/red]  {escape(f.title)}", highlight=False)
        console.print(f"   [green]fix:[/green] {escape(f.fix)}", highlight=False)


def _text_ranks(a, console) -> None:
    """One report per rank: how the clocks were joined, then one row per rank (the slow one starred)."""
    if not a.ranks:
        return
    console.print(f"Clocks: {escape(a.clock['how'])}", highlight=False)
    t = Table(title="Ranks, one report each (* the rank the others wait for)", title_justify="left",
              show_edge=False)
    for col in ("rank", "report", "GPU", "step median", "GPU busy", "waiting in collectives", "loader wait"):
        t.add_column(col, justify="left" if col in ("report", "GPU") else "right")
    for r in a.ranks:
        t.add_row(f"{r['rank']}{' *' if r['straggler'] else ''}", escape(r["report"].rsplit("/", 1)[-1]),
                  ",".join(map(str, r["device_ids"])) or "-", _ms(r["step_ns_median"]),
                  _pct(r["window_utilization"]), _ms(r["wait_ns"]), _ms(r["loader_wait_ns"]))
    console.print(t)


def _ms(ns: int | None) -> str:
    return "-" if ns is None else ms(ns)


# ---------------------------------------------------------------- HTML tables (the page's "Details")

def _html_ranks(a, d: dict) -> str:
    if not a.ranks:
        return ""
    return table(a.tables.get("ranks"), "Ranks, one report each",
                 {"rank": "rank", "report": "report", "device_ids": "GPU", "clock_offset_ns": "clock moved by",
                  "step_ns_median": "step median", "window_utilization": "GPU busy", "compute_ns": "compute",
                  "wait_ns": "waiting in collectives", "loader_wait_ns": "loader wait",
                  "straggler": "the others wait for it"}, a.clock["how"])


def _html_top_kernels(a, d: dict) -> str:
    top = a.tables.get("top_kernels")
    if top is None or not len(top):
        return ""
    total = d["transposes"]["kernel_time_ns"] if d.get("transposes") else int(top["time_ns"].sum())
    top = top.assign(mean_ns=top["time_ns"] / top["count"].clip(lower=1), kernel_time_share=top["time_ns"] / max(total, 1))
    return table(top, "Top kernels by GPU time", {"name": "kernel", "count": "launches", "time_ns": "total",
                                                  "mean_ns": "mean", "kernel_time_share": "share of kernel time"})


def _html_layout(a, d: dict) -> str:
    tr = d.get("transposes")
    if not tr or not tr["count"]:
        return ""
    t = a.tables
    return (table(t.get("transpose_kernels"), "Layout-transpose kernels (NCHW ↔ NHWC)",
                  {"name": "kernel", "count": "launches", "time_ns": "GPU time"},
                  f"{tr['count']:,} transposes took {ms(tr['time_ns'])}, {pct(tr['kernel_time_fraction'])} of all "
                  "kernel time.")
            + table(t.get("transpose_modules"), "…and the modules that caused them",
                    {"module": "module (NVTX range open at launch)", "phase": "phase", "count": "launches",
                     "time_ns": "GPU time", "via_fallback": "attributed via process-wide fallback"}))


def _html_pageable(a, d: dict) -> str:
    pg = d.get("pageable_h2d")
    if not pg or not pg["count"]:
        return ""
    return table(a.tables.get("pageable_sources"), "Host-to-device copies from pageable memory",
                 {"range": "NVTX range that issued them", "api": "CUDA call", "count": "copies", "bytes": "bytes",
                  "time_ns": "GPU time", "api_ns": "CPU blocked"},
                 f"{pg['count']:,} copies, {size(pg['bytes'])}, at {pg['bandwidth_gbps'] or 0:.1f} GB/s (pinned "
                 f"copies in this report: {pg['pinned_bandwidth_gbps'] or 0:.1f} GB/s).")


def _html_sync(a, d: dict) -> str:
    return table(a.tables.get("sync_sources"), "Host syncs (CPU blocked until the GPU caught up)",
                 {"api": "CUDA call", "range": "NVTX range", "count": "calls", "blocked_ns": "CPU blocked"})


def _html_loader(a, d: dict) -> str:
    return table(a.tables.get("loader_workers"), "DataLoader workers",
                 {"loader": "loader", "worker": "worker", "pid": "pid", "fetches": "batches",
                  "fetch_ns_median": "median fetch", "batches_per_s": "batches/s"})


SECTIONS: dict[str, Section] = {  # unit name -> what it shows, in reading order
    "window": Section(text=_text_window),
    "ranks": Section(text=_text_ranks, html=_html_ranks),
    "idle": Section(text=_text_idle),
    "communication": Section(text=_text_communication),
    "steps": Section(text=_text_steps),
    "startup": Section(text=_text_startup),
    "instrumentation": Section(text=_text_instrumentation),
    "window_figures": Section(text=_text_window_figures),
    "findings": Section(text=_text_findings),
    "top_kernels": Section(html=_html_top_kernels),
    "layout": Section(html=_html_layout),
    "pageable": Section(html=_html_pageable),
    "sync": Section(html=_html_sync),
    "loader": Section(html=_html_loader),
}


def html_tables(a, d: dict) -> str:
    """The page's Details: every unit's tables in reading order, then the notes on the report."""
    from nvtx_trace.report import skipped_by_reason
    from nvtx_trace.report.html_table import esc

    parts = [s.html(a, d) for s in SECTIONS.values() if s.html is not None]
    notes = "".join(f"<li><b>skipped {esc(', '.join(names))}</b>: {esc(why)}</li>"
                    for why, names in skipped_by_reason(d["skipped"]).items())
    notes += "".join(f"<li><b>warning</b>: {esc(w)}</li>" for w in d["warnings"])
    if notes:
        parts.append(f"<h3>Notes on this report</h3><ul class='notes'>{notes}</ul>")
    return "".join(parts) or "<p class='muted'>No kernel, copy or sync data in this report.</p>"
