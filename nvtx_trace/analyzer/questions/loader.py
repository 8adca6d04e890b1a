"""Does training wait for its DataLoader, and what would keep it fed?"""

from __future__ import annotations

import numpy as np

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.basis import of_window
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.loader_waits import (
    analyze_loader,
    contended_fetch_ns,
    pace,
    processes_per_host,
    taken_and_delivered,
    usable_workers,
    workers_needed,
)
from nvtx_trace.analyzer.measures.pageable_copies import per_step as per_step_pageable
from nvtx_trace.analyzer.measures.step_times import union_of_process
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import count, ms, pct


def _run(ctx: Context) -> None:
    ctx.result.loader = analyze_loader(ctx.trace.ranges, ctx.loader_pattern)
    if ctx.result.loader is None:
        ctx.result.skipped["dataloader_stall"] = ("no data-loader ranges (nvtx_autotrace's `dataloader.next [...]`, "
                                                  "or user ranges matching --loader-pattern)")


def _json(analysis) -> dict:
    if not analysis.loader:
        return {"dataloader": None}
    return {"dataloader": {"loaders": analysis.loader.loaders, "workers": analysis.loader.workers,
                           "worker_restarts": analysis.loader.restarts}}


def _tables(analysis) -> dict:
    if not analysis.loader:
        return {}
    loader = analysis.loader
    return {"loader_waits": loader.waits, "loaders": loader.loaders, "loader_workers": loader.workers}


def _html(analysis, d: dict, view) -> str:
    return view.table(analysis.tables.get("loader_workers"), "DataLoader workers",
                      {"loader": "loader", "worker": "worker", "pid": "pid", "fetches": "batches",
                       "fetch_ns_median": "median fetch", "batches_per_s": "batches/s"})


def _findings(analysis, basis) -> list[Finding]:
    if not analysis.loader or not len(analysis.loader.waits):
        return []
    window_ns = basis.gpu_ns if analysis.idle else basis.window_ns
    # Without GPU data, the cost is the training thread's wait itself.
    cost = basis.cause_ns.get("dataloader", 0) if analysis.idle else _wait_in_window(analysis)
    loader_pace = pace(analysis)
    behind = _falls_behind(analysis, loader_pace)
    measured = cost >= THRESHOLDS["min_impact_ns"] and cost >= THRESHOLDS["cause_fraction"] * window_ns
    if not measured:
        cost = behind["projected_wait_ns"] if behind else 0
        if cost < THRESHOLDS["min_impact_ns"] or cost < THRESHOLDS["cause_fraction"] * window_ns:
            return []
    loaders = analysis.loader.loaders.sort_values("wait_ns", ascending=False)
    top = loaders.iloc[0]
    fixes = []
    recommend: dict = {}
    compute = predict.compute_per_step(analysis)
    fetch = loader_pace.fetch_ns if loader_pace else float(top["fetch_ns_median"])
    slowest = " of the slowest rank" if loader_pace and loader_pace.slowest_rank else ""
    workers_after = None
    fetch_after = fetch
    several = False
    if int(top["workers"]) and compute:
        have = int(top["workers"])
        ranks = processes_per_host(analysis)[0]
        share = loader_pace.cpu_share if loader_pace else None
        need = workers_needed(fetch, compute, have, analysis.cpu_cores, ranks, share)
        usable = usable_workers(analysis, share)
        workers_after = min(need, usable) if usable is not None and need > have else max(need, have)
        workers_after = max(workers_after, have)
        fetch_after = contended_fetch_ns(fetch, have, workers_after, analysis.cpu_cores, ranks, compute, share)
        if workers_after > have:
            recommend["num_workers"] = int(workers_after)
        if need > have and (usable is None or need <= usable):
            deliver = "delivers" if have == 1 else "deliver"
            fixes.append(f"num_workers={need} (now {have}): a worker{slowest} needs {ms(fetch)} per batch and "
                         f"a step computes in {ms(compute)}, so {count(have, 'worker')} {deliver} a batch every "
                         f"{ms(fetch / have)}; {_cores_per_worker(share)}"
                         + _slower(fetch, fetch_after, need, analysis.cpu_cores))
        elif need > have:  # more workers than the machine has cores for: say so, and what else is left
            per_host, hosts = processes_per_host(analysis)
            ranks = count(per_host, "training process", "training processes")
            cores = (f"{_cores_words(analysis)} for {ranks}" if hosts == 1 else
                     f"the smallest of the {hosts} hosts has {analysis.cpu_cores} CPU cores for up to {ranks}")
            cores += " and each worker needs one" if not share or share >= WAITING else (
                f", and each worker, needing a CPU {pct(share)} of its fetch, needs that share of one")
            cheaper = ("make each batch cheaper to load (decode or augment on the GPU, cache decoded samples, "
                       "smaller inputs)")
            if usable > have:
                several = True  # more workers, and cheaper batches: the prediction is the workers' alone
                fixes.append(f"num_workers={usable} (now {have}; {need} would keep up, but {cores}): a batch then "
                             f"arrives every {ms(fetch_after / usable)} against a step of {ms(compute)}"
                             f"{_slower(fetch, fetch_after, usable, analysis.cpu_cores)}, so also {cheaper}")
            else:
                runs = "already runs" if have == 1 else "already run"
                fixes.append(f"{cheaper}: {need} workers would keep up with a step of {ms(compute)} "
                             f"({ms(fetch)} per batch each), but {cores}, and {count(have, 'worker')} {runs} (no "
                             "prediction: the step then follows how much cheaper a batch becomes)")
                workers_after = None  # nothing the tool can predict belongs to this fix
        else:
            fixes.append(f"prefetch_factor=4 or more: {have} workers are enough on average "
                         f"({ms(fetch)} per batch each, step {ms(compute)}) but batches arrive in bursts")
            recommend["prefetch_factor"] = 4
    elif int(top["workers"]) == 0 and compute and _loads_itself(top):
        # the loop loads each batch itself (its CPU time was recorded inside the wait): a worker would spend that
        wait, _ = _waits_in_window(analysis, top["loader"])
        share = float(top["fetch_cpu_share"])
        threads = top.get("fetch_cpu_threads")
        shared = threads is not None and threads == threads and threads > 1  # torch's threads shared the load:
        per_batch = wait * float(threads) if shared else wait  # one worker, with one thread, does all of it alone
        ranks = processes_per_host(analysis)[0]
        need = max(1, workers_needed(per_batch, compute, 0, analysis.cpu_cores, ranks, share))
        usable = usable_workers(analysis, share)
        workers_after = min(need, usable) if usable is not None else need
        fetch = per_batch
        fetch_after = contended_fetch_ns(per_batch, 0, workers_after, analysis.cpu_cores, ranks, compute, share)
        recommend["num_workers"] = int(workers_after)
        alone = (f" and {ms(per_batch)} of CPU time across {threads:.1f} threads, which one worker does alone"
                 if shared else "")
        fixes.append(f"num_workers={workers_after} (now 0: the training loop loads each batch itself, a median "
                     f"{ms(wait)} per batch{alone}, while a step computes in {ms(compute)}; workers load the next "
                     f"batches while the step runs); {_cores_per_worker(share)}"
                     + (f" ({need} would keep up, but {_cores_words(analysis)})" if need > workers_after else "")
                     + _slower(per_batch, fetch_after, workers_after, analysis.cpu_cores))
    elif int(top["workers"]) == 0:
        per = ms(_waits_in_window(analysis, top["loader"])[0])
        fixes.append(f"raise num_workers (no worker-process ranges were recorded: num_workers=0, or the report was "
                     f"captured without --trace-fork-before-exec=true); the loop waits a median {per} per batch"
                     + (f" while a step computes in {ms(compute)}" if compute else ""))
    per_step, _ = per_step_pageable(analysis)
    if per_step is not None and per_step.bytes >= THRESHOLDS["pageable_min_bytes"]:  # not DDP's few bytes
        fixes.append("pin_memory=True (pageable host-to-device copies were found inside the steps)")
        recommend["pin_memory"] = True
    for loader, extra in analysis.loader.restarts.items():
        fixes.append(f"persistent_workers=True ({loader}: workers were re-created {count(extra, 'time')})")
        recommend["persistent_workers"] = True
    n_gpus = len(analysis.idle.devices) if analysis.idle else 1
    if not measured:
        title = _behind_title(analysis, loader_pace, behind, n_gpus)
    else:
        if not analysis.idle:
            head = f"Training waits {ms(cost)} for data ({pct(cost / window_ns)} of the window)"
        elif n_gpus == 1:
            head = f"Training waits {ms(cost)} for data while the GPU idles ({of_window(analysis, cost / window_ns)})"
        else:  # GPU time summed over the GPUs, not one process's wait
            head = f"The {n_gpus} GPUs idle {ms(cost)} in all waiting for data ({of_window(analysis, cost / window_ns)})"
        median, batches = _waits_in_window(analysis, top["loader"])
        title = head + f"; loader {top['loader']}: median wait {ms(median)} over {count(batches, 'batch', 'batches')}"
        if behind:
            title += (f"; and steps will slow to about {ms(behind['delivery_ns'])} once the batches prefetched "
                      f"before the window run out ({loader_pace.words()})")
    sustained = loader_pace.interval_ns if behind is not None else None
    several = several or len(fixes) > 1
    part = f"num_workers={workers_after}" if several and recommend.get("num_workers") else None
    return [Finding(
        kind="dataloader_stall", title=title, impact_ns=int(cost),
        fix=predict.with_expected("In the DataLoader: " + "; ".join(fixes) if fixes
                                  else "Speed up the dataset's __getitem__ / collate.",
                                  predicted := predict.loader(analysis, fetch_after, compute, workers_after, sustained),
                                  part),
        recommend=recommend or None, predicted=predicted,
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window"
                  + ("" if measured else " (projected: the loader falls behind)"),
        evidence={"loaders": analysis.loader.loaders, "workers": analysis.loader.workers,
                  "compute_ns_per_step": int(compute) if compute else None, "fetch_ns_per_batch": int(fetch),
                  "falls_behind": behind},
    )]


def _waits_in_window(analysis, loader: str) -> tuple[float, int]:
    """The loop's waits on ``loader`` that began in the steady window: their median and number (the title's
    figures, measured where the finding's cost is)."""
    w = analysis.loader.waits
    w = w[w["loader"] == loader]
    if analysis.window:
        w = w[(w["start_ns"] >= analysis.window["start_ns"]) & (w["start_ns"] < analysis.window["end_ns"])]
    d = (w["end_ns"] - w["start_ns"]).to_numpy()
    return (float(np.median(d)) if len(d) else 0.0), int(len(d))


def _loads_itself(top) -> bool:
    """num_workers=0 for certain: nvtx_autotrace recorded the load's CPU time inside the loop's own wait (without
    worker ranges alone, workers may have run untraced: a capture without --trace-fork-before-exec=true)."""
    share = top.get("fetch_cpu_share")
    return share is not None and share == share


def _cores_words(analysis) -> str:
    if analysis.cpus_host and analysis.cpus_host != analysis.cpu_cores:
        return f"this process may use {analysis.cpu_cores} CPUs of the host's {analysis.cpus_host}"
    if not analysis.cpu_cores:
        return "the report does not say how many cores"
    return f"this machine has {analysis.cpu_cores} CPU cores"


WAITING = 0.5  # a worker on a CPU less than this share of its fetch mostly waits (storage, network, a sleep)


def _cores_per_worker(share: float | None) -> str:
    if share is not None and share < WAITING:
        return (f"a worker needs a CPU only {pct(share)} of its fetch (it waits the rest: storage, network), "
                "so workers need far fewer cores than their number")
    return "each worker needs a free CPU core"


def _slower(fetch: float, fetch_after: float, workers: int, cores: int | None) -> str:
    """The contention the advice counts in: more busy workers make each one slower."""
    if fetch_after <= fetch * 1.01:
        return ""
    return (f" (with {workers} workers busy on {cores} cores each takes about {ms(fetch_after)} per batch, as "
            "workers slow one another)")


def _falls_behind(analysis, loader_pace) -> dict | None:
    """Steps faster than the loader can deliver for good: the window ran on batches prefetched before it
    (a short window after a long warm-up), and the loop will wait once they run out. The wait is projected."""
    now, _ = predict.steady_step(analysis)
    if loader_pace is None or not now or loader_pace.interval_ns < THRESHOLDS["loader_behind_ratio"] * now:
        return None
    steps = len(analysis.steps.steady)
    n_gpus = len(analysis.idle.devices) if analysis.idle else 1  # every rank waits for the last batch
    per_step = loader_pace.interval_ns - now
    window = (analysis.window["start_ns"], analysis.window["end_ns"])
    taken, delivered = taken_and_delivered(analysis, loader_pace.loader, window)
    return {"step_ns": int(now), "delivery_ns": int(loader_pace.interval_ns), "wait_ns_per_step": int(per_step),
            "steps": steps, "projected_wait_ns": int(per_step * steps * n_gpus),
            "batches_taken": taken, "batches_delivered": delivered}


def _behind_title(analysis, loader_pace, behind: dict, n_gpus: int) -> str:
    gpus = f" on each of {n_gpus} GPUs" if n_gpus > 1 else ""
    loops = "training loops" if n_gpus > 1 else "training loop"
    return (f"The loader falls behind: the window's steps took {ms(behind['step_ns'])}, but "
            f"{loader_pace.words()}; those steps ran on batches prefetched before the window (in it the {loops} "
            f"took {behind['batches_taken']} batches and the workers finished {behind['batches_delivered']}), "
            f"and once they run out each step waits about {ms(behind['wait_ns_per_step'])} for data{gpus} "
            f"(projected, not measured: {ms(behind['projected_wait_ns'])} over the window's {behind['steps']} "
            "steps; a longer window, nvtx-trace run --full, measures it)")


def _wait_in_window(analysis) -> int:
    if not analysis.steps:
        return iv.total(analysis.loader.wait_set)
    # the training process the steps belong to (one rank of a DDP job), over its steady window
    w = union_of_process(analysis.loader.waits, analysis.steps.pid)
    window = analysis.steps.steady_window()
    return int(iv.Coverage(w).measure(*window)) if window else iv.total(w)


QUESTION = Question(
    name="loader", order=10, run=_run,
    thresholds={"loader_behind_ratio": 1.1},  # workers deliver a batch this much slower than a step: prefetched
    findings=_findings,
    json_keys=("dataloader",), json_at=70, to_json=_json, tables=_tables,
    html=_html, html_at=60,
)
