"""Turn analysis results into ranked findings, each with its measured cost and a concrete fix."""

from __future__ import annotations

import numpy as np

from nvtx_trace.analyzer import intervals as iv
from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.dataloader import (
    pace,
    processes_per_host,
    taken_and_delivered,
    usable_workers,
    workers_needed,
)
from nvtx_trace.analyzer.findings import CAUSE_FIXES, THRESHOLDS, Finding, count, ms, pct, size
from nvtx_trace.analyzer.gpu_idle import gaps_in
from nvtx_trace.analyzer.pageable import within
from nvtx_trace.analyzer.steps import union_of_process
from nvtx_trace.analyzer.straggler import straggler


def build_findings(a) -> list:
    out: list[Finding] = []
    window_ns = max(1, a.window.get("end_ns", 0) - a.window.get("start_ns", 0)) if a.window else 1
    causes = a.window_causes
    # Idle time is summed over GPUs, so shares are of GPU time: the window times the number of GPUs.
    cause_ns = causes.groupby("cause")["idle_ns"].sum().to_dict() if causes is not None and len(causes) else {}
    gpu_ns = window_ns * max(1, len(a.idle.devices) if a.idle else 1)
    out += _dataloader(a, cause_ns.get("dataloader", 0), gpu_ns if a.idle else window_ns)
    out += _layout(a)
    out += _pageable(a)
    out += _sync(a, cause_ns.get("sync", 0), gpu_ns)
    short = {dev.device_id: _short_idle(a, dev) for dev in a.idle.devices} if a.idle and a.window else {}
    out += straggler(a, gpu_ns, short)
    keep = _after_own_cost(a, cause_ns, sum(s[0] for s in short.values()))
    out += _cpu_overhead(a, cause_ns, gpu_ns, keep)
    out += _launch_bound(a, window_ns, short, keep)
    # Impacts add up: idle time a cause finding already counts is not counted again. What is left,
    # idle in gaps whose cause has no finding of its own, is one finding; the total is a headline figure.
    covered = {f.evidence.get("cause") for f in out if isinstance(f.evidence, dict)}
    covered |= {{"dataloader_stall": "dataloader", "sync": "sync", "pageable_h2d": "copy"}.get(f.kind) for f in out}
    left = {c: int(ns * keep) if c in CPU_CAUSES else ns for c, ns in cause_ns.items() if c not in covered}
    out += _gpu_idle(a, left, gpu_ns)  # (the tool's own share of CPU-bound idle is out of it too)
    predict.add_predictions(a, out)
    # biggest cost first, but a fix the loader's pace leaves without gain after the ones that gain
    return sorted(out, key=lambda f: (bool(f.predicted and f.predicted.get("bound_by") == "loader"
                                           and f.predicted["saving_ns"] <= 0), -f.impact_ns))


def _of_window(a, share: float) -> str:
    """"37 % of the window", or of the GPUs' time in it when there are several."""
    n = len(a.idle.devices) if a.idle else 1
    return f"{pct(share)} of the window" + (f" across {n} GPUs" if n > 1 else "")


def _gpu_idle(a, cause_ns: dict, window_ns: int) -> list[Finding]:
    """Idle in gaps >= --min-gap-ms whose causes (``cause_ns``: those no other finding counts) have no
    finding of their own."""
    if not a.idle:
        return []
    in_window = gaps_in(a.idle.gaps, (a.window["start_ns"], a.window["end_ns"]))
    in_window = in_window[in_window["cause"].isin(list(cause_ns))] if "cause" in in_window else in_window
    idle = int(sum(cause_ns.values()))
    if idle < THRESHOLDS["min_impact_ns"] or idle < THRESHOLDS["gpu_idle_fraction"] * window_ns:
        return []
    ranked = sorted(cause_ns.items(), key=lambda kv: kv[1], reverse=True)
    labels = dict(zip(a.window_causes["cause"], a.window_causes["label"]))
    top, top_ns = ranked[0]
    parts = ", ".join(f"{labels[c]}: {pct(ns / idle)}" for c, ns in ranked[:3] if ns)
    devs = ", ".join(f"GPU {d} {pct(u)} busy" for d, u in a.window_utilization.items())
    fix = CAUSE_FIXES.get(top, "")
    per_step = _per_step_pageable(a)[0]
    if top == "copy" and per_step is not None and not per_step.count:
        # the label came from the copy range the thread was in; its copies are pinned already
        fix = ("The copies inside the steps already come from pinned memory: overlap them with compute "
               "(copy the next batch on a side stream, non_blocking=True) or copy fewer bytes (uint8 inputs, "
               "normalize on the GPU).")
    return [Finding(
        kind="gpu_idle",
        title=f"GPU idle {ms(idle)} ({pct(idle / window_ns)} of the window"
              + (f", summed over {len(a.idle.devices)} GPUs" if len(a.idle.devices) > 1 else "")
              + f") in gaps >= {ms(a.min_gap_ns)} that no other finding counts; {parts}",
        impact_ns=idle,
        fix=fix,
        threshold=f"gaps >= {ms(a.min_gap_ns)} covering >= {pct(THRESHOLDS['gpu_idle_fraction'])} of the window",
        evidence={"window": a.window, "devices": devs,
                  "causes": a.window_causes[["device_id", "cause", "label", "idle_ns", "share", "gaps"]],
                  "largest_gaps": in_window.nlargest(5, "duration_ns")[["device_id", "start_ns", "duration_ns", "cause"]],
                  "cpu_during_largest_gaps": a.gap_activity.head(20) if a.gap_activity is not None else []},
    )]


def _dataloader(a, idle_ns: int, window_ns: int) -> list[Finding]:
    if not a.loader or not len(a.loader.waits):
        return []
    # Without GPU data, the cost is the training thread's wait itself.
    cost = idle_ns if a.idle else _wait_in_window(a)
    loader_pace = pace(a)
    behind = _falls_behind(a, loader_pace)
    measured = cost >= THRESHOLDS["min_impact_ns"] and cost >= THRESHOLDS["cause_fraction"] * window_ns
    if not measured:
        cost = behind["projected_wait_ns"] if behind else 0
        if cost < THRESHOLDS["min_impact_ns"] or cost < THRESHOLDS["cause_fraction"] * window_ns:
            return []
    loaders = a.loader.loaders.sort_values("wait_ns", ascending=False)
    top = loaders.iloc[0]
    fixes = []
    recommend: dict = {}
    compute = predict.compute_per_step(a)
    fetch = loader_pace.fetch_ns if loader_pace else float(top["fetch_ns_median"])
    slowest = " of the slowest rank" if loader_pace and loader_pace.slowest_rank else ""
    workers_after = None
    if int(top["workers"]) and compute:
        need = workers_needed(fetch, compute)
        have = int(top["workers"])
        usable = usable_workers(a)
        workers_after = min(need, usable) if usable is not None and need > have else max(need, have)
        workers_after = max(workers_after, have)
        if workers_after > have:
            recommend["num_workers"] = int(workers_after)
        if need > have and (usable is None or need <= usable):
            deliver = "delivers" if have == 1 else "deliver"
            fixes.append(f"num_workers={need} (now {have}): a worker{slowest} needs {ms(fetch)} per batch and "
                         f"a step computes in {ms(compute)}, so {count(have, 'worker')} {deliver} a batch every "
                         f"{ms(fetch / have)}; each worker needs a free CPU core")
        elif need > have:  # more workers than the machine has cores for: say so, and what else is left
            per_host, hosts = processes_per_host(a)
            ranks = count(per_host, "training process", "training processes")
            cores = (f"this machine has {a.cpu_cores} CPU cores for {ranks}" if hosts == 1 else
                     f"the smallest of the {hosts} hosts has {a.cpu_cores} CPU cores for up to {ranks}")
            cores += " and each worker needs one"
            cheaper = ("make each batch cheaper to load (decode or augment on the GPU, cache decoded samples, "
                       "smaller inputs)")
            if usable > have:
                fixes.append(f"num_workers={usable} (now {have}; {need} would keep up, but {cores}): a batch then "
                             f"arrives every {ms(fetch / usable)} against a step of {ms(compute)}, "
                             f"so also {cheaper}")
            else:
                fixes.append(f"{cheaper}: {need} workers would keep up with a step of {ms(compute)} "
                             f"({ms(fetch)} per batch each), but {cores}, and {have} already run")
        else:
            fixes.append(f"prefetch_factor=4 or more: {have} workers are enough on average "
                         f"({ms(fetch)} per batch each, step {ms(compute)}) but batches arrive in bursts")
    elif int(top["workers"]) == 0:
        per = ms(top["wait_ns_median"])
        fixes.append(f"raise num_workers (no worker-process ranges were recorded: num_workers=0, or the report was "
                     f"captured without --trace-fork-before-exec=true); the loop waits a median {per} per batch"
                     + (f" while a step computes in {ms(compute)}" if compute else ""))
    per_step, _ = _per_step_pageable(a)
    if per_step is not None and per_step.bytes >= THRESHOLDS["pageable_min_bytes"]:  # not DDP's few bytes
        fixes.append("pin_memory=True (pageable host-to-device copies were found inside the steps)")
        recommend["pin_memory"] = True
    for loader, extra in a.loader.restarts.items():
        fixes.append(f"persistent_workers=True ({loader}: workers were re-created {count(extra, 'time')})")
    n_gpus = len(a.idle.devices) if a.idle else 1
    if not measured:
        title = _behind_title(a, loader_pace, behind, n_gpus)
    else:
        if not a.idle:
            head = f"Training waits {ms(cost)} for data ({pct(cost / window_ns)} of the window)"
        elif n_gpus == 1:
            head = f"Training waits {ms(cost)} for data while the GPU idles ({_of_window(a, cost / window_ns)})"
        else:  # GPU time summed over the GPUs, not one process's wait
            head = f"The {n_gpus} GPUs idle {ms(cost)} in all waiting for data ({_of_window(a, cost / window_ns)})"
        title = (head + f"; loader {top['loader']}: median wait {ms(top['wait_ns_median'])} over "
                 f"{int(top['waits'])} batches")
        if behind:
            title += (f"; and steps will slow to about {ms(behind['delivery_ns'])} once the batches prefetched "
                      f"before the window run out ({loader_pace.words()})")
    sustained = loader_pace.interval_ns if behind is not None else None
    return [Finding(
        kind="dataloader_stall", title=title, impact_ns=int(cost),
        fix=predict.with_expected("In the DataLoader: " + "; ".join(fixes) if fixes
                                  else "Speed up the dataset's __getitem__ / collate.",
                                  predicted := predict.loader(a, fetch, compute, workers_after, sustained)),
        recommend=recommend or None, predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window"
                  + ("" if measured else " (projected: the loader falls behind)"),
        evidence={"loaders": a.loader.loaders, "workers": a.loader.workers,
                  "compute_ns_per_step": int(compute) if compute else None, "fetch_ns_per_batch": int(fetch),
                  "falls_behind": behind},
    )]


def _falls_behind(a, loader_pace) -> dict | None:
    """Steps faster than the loader can deliver for good: the window ran on batches prefetched before it
    (a short window after a long warm-up), and the loop will wait once they run out. The wait is projected."""
    now, _ = predict.steady_step(a)
    if loader_pace is None or not now or loader_pace.interval_ns < THRESHOLDS["loader_behind_ratio"] * now:
        return None
    steps = len(a.steps.steady)
    n_gpus = len(a.idle.devices) if a.idle else 1  # every rank waits for the last batch
    per_step = loader_pace.interval_ns - now
    taken, delivered = taken_and_delivered(a, loader_pace.loader, (a.window["start_ns"], a.window["end_ns"]))
    return {"step_ns": int(now), "delivery_ns": int(loader_pace.interval_ns), "wait_ns_per_step": int(per_step),
            "steps": steps, "projected_wait_ns": int(per_step * steps * n_gpus),
            "batches_taken": taken, "batches_delivered": delivered}


def _behind_title(a, loader_pace, behind: dict, n_gpus: int) -> str:
    gpus = f" on each of {n_gpus} GPUs" if n_gpus > 1 else ""
    loops = "training loops" if n_gpus > 1 else "training loop"
    return (f"The loader falls behind: the window's steps took {ms(behind['step_ns'])}, but "
            f"{loader_pace.words()}; those steps ran on batches prefetched before the window (in it the {loops} "
            f"took {behind['batches_taken']} batches and the workers finished {behind['batches_delivered']}), "
            f"and once they run out each step waits about {ms(behind['wait_ns_per_step'])} for data{gpus} "
            f"(projected, not measured: {ms(behind['projected_wait_ns'])} over the window's {behind['steps']} "
            "steps; a longer window, nvtx-trace run --full, measures it)")


def _wait_in_window(a) -> int:
    if not a.steps:
        return iv.total(a.loader.wait_set)
    # the training process the steps belong to (one rank of a DDP job), over its steady window
    w = union_of_process(a.loader.waits, a.steps.pid)
    window = a.steps.steady_window()
    return int(iv.Coverage(w).measure(*window)) if window else iv.total(w)


def _layout(a) -> list[Finding]:
    lay = a.layout
    if not lay or not lay.count or lay.kernel_time_fraction < THRESHOLDS["transpose_kernel_fraction"]:
        return []
    mods = lay.by_module.head(5)
    where = ", ".join(f"{m} [{p}]" for m, p in zip(mods["module"], mods["phase"]))
    return [Finding(
        kind="layout_transpose",
        title=f"{lay.count} NCHW<->NHWC transpose kernels took {ms(lay.time_ns)} of GPU time "
              f"({pct(lay.kernel_time_fraction)} of kernel time); top modules: {where}",
        impact_ns=lay.time_ns,
        fix="Use channels_last: model = model.to(memory_format=torch.channels_last) and "
            "x = x.to(device, memory_format=torch.channels_last) for the inputs.",
        threshold=f">= {pct(THRESHOLDS['transpose_kernel_fraction'])} of kernel time",
        evidence={"kernels": lay.by_kernel, "modules": lay.by_module.head(20)},
    )]


def _per_step_pageable(a):
    """Pageable copies inside the training steps, and the scope in words: copies outside them (loading the
    model) happen once, so they are worth neither a finding nor pinning advice."""
    if a.pageable and a.steps:
        return within(a.pageable, list(zip(a.steps.table["start_ns"], a.steps.table["end_ns"]))), \
            "inside training steps"
    return a.pageable, "in the whole trace"


def _pageable(a) -> list[Finding]:
    p, scope = _per_step_pageable(a)
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
        title=f"{p.count} host-to-device copies from pageable memory {scope} ({size(p.bytes)}) took {ms(p.time_ns)} on the GPU "
              f"at {bw}, blocking the CPU {ms(p.api_ns)}; issued from {where}",
        impact_ns=int(cost),
        fix="Pin the source: DataLoader(pin_memory=True) (or tensor.pin_memory()) and copy with "
            "x.to(device, non_blocking=True).",
        threshold=f">= {size(THRESHOLDS['pageable_min_bytes'])} copied",
        evidence={"sources": p.by_source.head(20), "pageable_gbps": p.bandwidth_gbps,
                  "pinned_gbps": p.pinned_bandwidth_gbps},
    )]


def _sync(a, idle_ns: int, window_ns: int) -> list[Finding]:
    if not a.sync or not a.sync.count:
        return []
    if idle_ns < THRESHOLDS["min_impact_ns"] or idle_ns < THRESHOLDS["cause_fraction"] * window_ns:
        return []
    src = a.sync.by_source.head(3)
    where = "; ".join(f"{api} in {r} (x{c})" for api, r, c in zip(src["api"], src["range"], src["count"]))
    return [Finding(
        kind="sync", title=f"Host syncs let the GPU run dry: {ms(idle_ns)} idle after syncs; top: {where}",
        impact_ns=int(idle_ns), fix=CAUSE_FIXES["sync"],
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
        evidence={"sources": a.sync.by_source.head(20), "count": a.sync.count, "blocked_ns": a.sync.blocked_ns},
    )]


CPU_CAUSES = ("cuda_api", "optimizer", "backward", "forward", "other_range", "unattributed")


def _cpu_overhead(a, cause_ns: dict, window_ns: int, keep: float) -> list[Finding]:
    out = []
    for cause in CPU_CAUSES:
        raw = cause_ns.get(cause, 0)
        ns = int(raw * keep)
        if ns < THRESHOLDS["min_impact_ns"] or ns < THRESHOLDS["cause_fraction"] * window_ns:
            continue
        label = dict(zip(a.window_causes["cause"], a.window_causes["label"]))[cause]
        out.append(Finding(
            kind="cuda_api" if cause == "cuda_api" else "cpu_overhead",
            title=f"GPU idle {ms(ns)} ({_of_window(a, ns / window_ns)}): {label}" + _own_cost_note(a, raw - ns)
                  + (_profiler_unmeasured(a) if cause == "cuda_api" else ""),
            impact_ns=ns, fix=CAUSE_FIXES[cause],
            threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
            evidence={"cause": cause, "idle_ns": int(raw), "instrumentation_ns": int(raw - ns)},
        ))
    return out


def _short_idle(a, dev):
    """Idle stretches shorter than --min-gap-ms (by full length), clipped to the window: (ns, count, median)."""
    w0, w1 = a.window["start_ns"], a.window["end_ns"]
    h0, h1 = iv.holes(dev.busy, min_len=1)
    inside = (h1 - h0 < a.min_gap_ns) & (h1 > w0) & (h0 < w1)
    short_idle = int((np.minimum(h1[inside], w1) - np.maximum(h0[inside], w0)).sum())
    n_short = int(inside.sum())
    return short_idle, n_short, float(np.median(h1[inside] - h0[inside])) if n_short else 0.0


def _launch_bound(a, window_ns: int, short: dict, keep: float) -> list[Finding]:
    """Idle time too finely chopped for the gap analysis: many gaps shorter than --min-gap-ms."""
    if not a.idle or not a.window:
        return []
    out = []
    for dev in a.idle.devices:
        busy = int(round(a.window_utilization.get(dev.device_id, 0.0) * window_ns))
        raw, n_short, median = short[dev.device_id]
        short_idle = int(raw * keep)
        if short_idle < THRESHOLDS["min_impact_ns"] or short_idle < THRESHOLDS["launch_bound_fraction"] * window_ns:
            continue
        out.append(Finding(
            kind="cpu_overhead",
            title=f"GPU {dev.device_id} is busy only {pct(busy / window_ns)} of the window; {ms(raw)} "
                  f"({pct(raw / window_ns)}) is lost in {n_short} gaps shorter than {ms(a.min_gap_ns)} "
                  f"(median {ms(median)}): kernel launches cannot keep up" + _own_cost_note(a, raw - short_idle)
                  + _profiler_unmeasured(a),
            impact_ns=short_idle, fix=CAUSE_FIXES["launch_bound"],
            threshold=f"gaps < {ms(a.min_gap_ns)} covering >= {pct(THRESHOLDS['launch_bound_fraction'])} of the window",
            evidence={"device_id": dev.device_id, "busy_ns": busy, "short_gaps": n_short, "short_idle_ns": raw,
                      "instrumentation_ns": raw - short_idle},
        ))
    return out


def own_cost_ns(a) -> int:
    """CPU time the tool itself added in the analysis window: nvtx_autotrace's ranges (measured, see
    instrumentation.py) and, where the process timed steps just before the capture, the profiler's tracing."""
    inst = a.instrumentation
    if inst is None or not a.steps:
        return 0
    per_step = (inst.cost_ns_per_step or 0) + (inst.profiler_cost_ns_per_step or 0)
    return int(per_step * len(a.steps.steady) * max(1, len(a.idle.devices) if a.idle else 1))


def _after_own_cost(a, cause_ns: dict, short_idle_ns: int) -> float:
    """Share of CPU-bound idle time left once the tool's own CPU time is taken out.

    When the CPU limits the loop, each ns the tool costs can idle the GPU for at most one ns;
    the cost is taken out of CPU-bound idle (long gaps with a CPU cause and short gaps) pro rata.
    """
    own = own_cost_ns(a)
    if not own or not a.idle:
        return 1.0
    pool = sum(cause_ns.get(c, 0) for c in CPU_CAUSES)
    pool += short_idle_ns
    return max(0.0, 1.0 - own / pool) if pool else 1.0


def _profiler_unmeasured(a) -> str:
    """Launch-bound figures measured under CUDA API tracing include the tracing's own cost per call, which
    only a run that timed its steps outside the capture can separate (nvtx_autotrace's capture window)."""
    inst = a.instrumentation
    if inst is not None and inst.outside_capture_step_ns is not None:
        return ""
    return ("; part of it may be the profiler's own CUDA tracing, which slows every launch and is not measured "
            "in this capture (nvtx-trace run with --warmup-steps and --steps times the steps before the capture "
            "and leaves that cost out)")


def _own_cost_note(a, subtracted: int) -> str:
    inst = a.instrumentation
    if inst is not None and inst.cost_ns_per_step is None and inst.module_ranges_per_step >= 1:
        return (f" (this report carries {inst.module_ranges_per_step:.0f} nvtx_autotrace module ranges per step "
                "whose cost was not measured: it was captured before the instrumentation measured itself; "
                "capture it again to have that cost measured and left out)")
    if subtracted <= 0:
        return ""
    parts = []
    if inst.cost_ns_per_step:
        parts.append(f"nvtx_autotrace's ranges {ms(inst.cost_ns_per_step)}/step ({inst.ranges_per_step:.0f} ranges)")
    if inst.profiler_cost_ns_per_step:
        parts.append(f"the profiler's own tracing {ms(inst.profiler_cost_ns_per_step)}/step (steps took "
                     f"{ms(inst.outside_capture_step_ns)} just before the capture, without it)")
    return f" ({ms(subtracted)} of it is the tool's own measured cost: {' and '.join(parts)}; left out of the impact)"
