"""Terminal summary: the biggest recoverable time first, then the fix, in a screenful."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nvtx_trace.analyzer.findings import ms, pct
from nvtx_trace.analyzer.instrumentation import depth_text


def _pct(x: float | None) -> str:
    return "-" if x is None else pct(x)


def render(a, console: Console) -> None:
    shown = a.path if not a.ranks else f"{len(a.ranks)} reports merged ({a.ranks[0]['report']} ...)"
    console.print(f"[bold]nvtx-trace[/bold] {shown}  (nsys {a.nsys_version or '?'}, export schema "
                  f"{a.schema_version or '?'})")
    if a.ranks:
        _ranks(a, console)
    if a.idle and a.idle.devices:
        t = Table(title="GPU activity", title_justify="left", show_edge=False)
        for col in ("GPU", "busy", "span", "util.", "util. steady", f"gaps>={ms(a.min_gap_ns)}", "idle in gaps"):
            t.add_column(col, justify="right" if col != "GPU" else "left")
        for d in a.idle.devices:
            steady = a.window_utilization.get(d.device_id)
            t.add_row(f"{d.device_id} {d.name}", ms(d.busy_ns), ms(d.span_ns), pct(d.utilization),
                      pct(steady) if steady is not None else "-", str(d.gap_count), ms(d.gap_idle_ns))
        console.print(t)
    if a.communication is not None:
        t = Table(title="Communication (steady window): busy time that is not work", title_justify="left",
                  show_edge=False)
        for col in ("GPU", "compute", "communication", "of it waiting for a peer", "overlapped"):
            t.add_column(col, justify="right")
        for d in a.communication.devices:
            t.add_row(str(d.device_id), ms(d.compute_ns), ms(d.communication_ns), ms(d.wait_ns), ms(d.overlap_ns))
        console.print(t)
    if a.steps:
        s = a.steps.summary()
        if s:
            unknown = any(v is None for k, v in s.items() if k.endswith("_fraction"))
            console.print(
                f"Steps ({a.steps.how}): {s['steps']} ({s['warmup_steps']} warm-up left out); steady state "
                f"median {ms(s['step_ns_median'])}, p90 {ms(s['step_ns_p90'])}; GPU busy {_pct(s['gpu_busy_fraction'])}, "
                f"waiting for data {_pct(s['loader_wait_fraction'])}, in host syncs {_pct(s['sync_wait_fraction'])} "
                "of step time" + (" (-: not captured)" if unknown else ""), highlight=False)
            modes = s.get("modes")
            if modes:
                console.print(f"Steps come in two kinds: {modes['low_steps']} of about {ms(modes['low_ns'])} and "
                              f"{modes['high_steps']} of about {ms(modes['high_ns'])} (mean {ms(s['step_ns_mean'])}); "
                              "the median describes neither", highlight=False)
    st = a.startup
    if st is not None and st.duration_ns > 0:
        parts = ", ".join(f"{k} {ms(v)}" for k, v in list(st.parts.items())[:3])
        console.print(f"Start-up: {ms(st.duration_ns)} before the first step" + (f" (slow CUDA calls: {parts})"
                      if parts else "") + "; it happens once and is left out of every per-step figure",
                      highlight=False)
    inst = a.instrumentation
    if inst:
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
    if a.window_causes is not None and len(a.window_causes):
        t = Table(title=f"Why the GPU idles ({a.window.get('source', '')})", title_justify="left", show_edge=False)
        several = a.window_causes["device_id"].nunique() > 1
        if several:
            t.add_column("GPU", justify="right")
        t.add_column("cause")
        t.add_column("idle", justify="right")
        t.add_column("share", justify="right")
        for r in a.window_causes.itertuples():
            t.add_row(*([str(r.device_id)] if several else []), r.label, ms(r.idle_ns), pct(r.share))
        console.print(t)
    if a.gap_activity is not None and len(a.gap_activity):
        several = a.gap_activity["device_id"].nunique() > 1
        t = Table(title="Largest gaps: what the CPU was doing ('at': time since the trace began)",
                  title_justify="left", show_edge=False)
        for col in (["GPU"] if several else []) + ["at", "gap", "cause", "thread", "inside"]:
            t.add_column(col, justify="right" if col in ("GPU", "at", "gap") else "left")
        shown = 0
        keys = ["device_id", "gap_start_ns", "gap_ns", "cause"]
        for (device, start, gap_ns, cause), rows in a.gap_activity.groupby(keys, sort=False):
            if shown == 3:
                break
            shown += 1
            for i, r in enumerate(rows.head(4).itertuples()):
                label = r.name if r.what == "nvtx" else f"CUDA {r.name}"
                first = i == 0
                t.add_row(*([str(device) if first else ""] if several else []),
                          ms(start - a.trace_start_ns) if first else "", ms(gap_ns) if first else "",
                          cause if first else "", escape(r.thread), escape(label))
        console.print(t)
    if a.findings:
        console.print("[bold]Findings[/bold] (biggest measured cost first)")
        for i, f in enumerate(a.findings, 1):
            console.print(f"{i}. [bold]{f.kind}[/bold] [red]{ms(f.impact_ns)}[/red]  {escape(f.title)}", highlight=False)
            console.print(f"   [green]fix:[/green] {escape(f.fix)}", highlight=False)
    else:
        console.print("[green]No findings above the thresholds: nothing obvious to fix.[/green]")
    for name, why in a.skipped.items():
        console.print(f"[yellow]skipped[/yellow] {name}: {escape(why)}", highlight=False)
    for w in a.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False)


def _ranks(a, console: Console) -> None:
    """One row per input report (rank): where its figures differ from the others', the slow rank shows."""
    console.print(f"Clocks: {escape(a.clock['how'])}", highlight=False)
    t = Table(title="Ranks (steady window; * the rank the others wait for)", title_justify="left", show_edge=False)
    for col in ("rank", "report", "GPU", "step median", "GPU busy", "waiting in collectives", "loader wait"):
        t.add_column(col, justify="left" if col in ("report", "GPU") else "right")

    def opt(ns):
        return "-" if ns is None else ms(ns)

    for r in a.ranks:
        t.add_row(f"{r['rank']}{' *' if r['straggler'] else ''}", escape(r["report"].rsplit("/", 1)[-1]),
                  ",".join(map(str, r["device_ids"])) or "-", opt(r["step_ns_median"]),
                  _pct(r["window_utilization"]), opt(r["wait_ns"]), opt(r["loader_wait_ns"]))
    console.print(t)
