"""Where does GPU memory go: how full the GPU gets, what the allocator holds unused, whether it grows step after
step, which part of the step sets the peak, and why a run died of out-of-memory.

nvtx_autotrace writes one record per step from the caching allocator's counters (nvtx_autotrace/memory.py:
allocated and reserved at the step's start, the step's peaks, the peak by the time backward and the optimizer
step began), the loop's lines whose live bytes grew in warm-up, and an out-of-memory error as the allocator saw
it. Where nsys traced CUDA memory (``--cuda-memory-usage=true``), the driver-level high-water mark comes from
the export too: PyTorch's reserve plus what libraries allocate beside it (cuBLAS workspaces, NCCL buffers).
"""

from __future__ import annotations

import numpy as np

from nvtx_trace import names
from nvtx_trace.analyzer.findings import THRESHOLDS as T
from nvtx_trace.analyzer.findings import Finding
from nvtx_trace.analyzer.measures.instrumentation_cost import read_records
from nvtx_trace.analyzer.question import Context, Question
from nvtx_trace.units import ms, size

THRESHOLDS = {
    "memory_growth_min_bytes": 1 << 20,  # a step's start grows by >= 1 MiB a step on average ...
    "memory_growth_rising_share": 0.75,  # ... and rises from one step to the next in >= 75 % of them
    "memory_growth_min_steps": 4,  # over at least this many recorded steps
    "memory_unused_reserved_fraction": 0.25,  # the allocator holds >= 25 % of its reserve unused at the peak ...
    "memory_unused_reserved_min_bytes": 1 << 30,  # ... and >= 1 GiB of it
    "memory_tight_fraction": 0.9,  # the peak reserve is >= 90 % of the device: fragmentation can end the run
    "memory_fold_fits_fraction": 0.8,  # a larger micro-batch's predicted peak stays under 80 % of the device
}
NOT_RECORDED = "GPU memory: not recorded (no CUDA in the program, no nvtx_autotrace, or a capture from before it did)"
FRAGMENTATION_FIX = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def _phase(r: dict) -> str | None:
    peak, fwd, bwd = r.get("peak_allocated"), r.get("forward_peak"), r.get("backward_peak")
    if peak is None or (fwd is None and bwd is None):
        return None
    if fwd is not None and fwd >= peak:
        return "forward"
    if bwd is not None and bwd >= peak:
        return "backward"
    return "optimizer" if bwd is not None else "backward"


def _run(ctx: Context) -> None:
    analysis, ranges = ctx.result, ctx.trace.ranges
    pid = analysis.steps.pid if analysis.steps else None
    per_step = read_records(ranges, names.MEMORY_PREFIX, pid)
    ooms = read_records(ranges, names.OOM_PREFIX, pid)
    lines = read_records(ranges, names.MEMORY_LINES_PREFIX, pid)
    usage = ctx.reader.memory_usage()
    if not per_step and not ooms and usage is None:
        analysis.memory = None
        return
    by_step = {}
    for r in per_step:
        if isinstance(r.get("step"), int):
            by_step[r["step"]] = r
    rows = [by_step[k] for k in sorted(by_step)]
    steady = _steady_steps(analysis)
    kept = [r for r in rows if steady is None or r["step"] in steady] or rows
    device = (analysis.settings or {}).get("device") or {}
    total = device.get("memory_total_bytes") or (ooms[-1].get("device_total_bytes") if ooms else None)
    peak_a = max((r["peak_allocated"] for r in kept), default=None)
    peak_r = max((r["peak_reserved"] for r in kept), default=None)
    phased = [r for r in kept if _phase(r)]  # the peaks by phase are read every 4th step
    at_peak = max(phased, key=lambda r: r["peak_allocated"]) if phased else None
    analysis.memory = {
        "source": "allocator" if rows else "nsys" if usage is not None else "oom",
        "peak_allocated_bytes": peak_a,
        "peak_reserved_bytes": peak_r,
        "device_total_bytes": total,
        "headroom_bytes": (total - peak_r) if total and peak_r is not None else None,
        "unused_reserved_bytes": (peak_r - peak_a) if peak_r is not None and peak_a is not None else None,
        "peak_phase": _phase(at_peak) if at_peak else None,
        "growth_bytes_per_step": _growth(kept),
        "growth_rising_share": _rising(kept),
        "growing_lines": (lines[-1].get("lines") or []) if lines else [],
        "growing_lines_steps": [lines[-1].get("from_step"), lines[-1].get("to_step")] if lines else None,
        "alloc_conf": device.get("alloc_conf"),
        "device_free_bytes": device.get("memory_free_bytes"),
        "per_step": [{"step": r["step"], "allocated_bytes": r.get("allocated"), "reserved_bytes": r.get("reserved"),
                      "peak_allocated_bytes": r.get("peak_allocated"), "peak_reserved_bytes": r.get("peak_reserved"),
                      "peak_phase": _phase(r), "steady": steady is None or r["step"] in steady} for r in rows],
        "nsys": usage,
        "oom": ooms[-1] if ooms else None,
    }
    analysis.memory.update(_fold(kept, total))


def _fold(rows: list[dict], total) -> dict:
    """Micro-batches a step (backward passes: gradient accumulation), and how many of them fit in one: the
    activations one micro-batch adds to what the step starts with (weights, gradients, optimizer state) scale
    with its size, so k of them together peak at start + k x (peak - start)."""
    counts = [r["backwards"] for r in rows if isinstance(r.get("backwards"), int)]
    micro = int(np.median(counts)) if counts else None
    out = {"micro_batches": micro, "fold": None}
    both = [(r["allocated"], r["peak_allocated"]) for r in rows
            if isinstance(r.get("allocated"), int) and isinstance(r.get("peak_allocated"), int)]
    if not micro or micro < 2 or not total or not both:
        return out
    # each step's own rise over its start (memory that grows from step to step is no micro-batch's), and the
    # largest start (what the steps start from by the end)
    start, activations = float(max(a for a, _ in both)), float(max(p - a for a, p in both))
    if activations <= 0:
        return out
    most = int((T["memory_fold_fits_fraction"] * total - start) // activations)
    factor = max((k for k in range(2, micro + 1) if micro % k == 0 and k <= most), default=None)
    if factor:
        out["fold"] = {"factor": factor, "micro_batches_after": micro // factor,
                       "predicted_peak_allocated_bytes": int(start + factor * activations),
                       "activations_bytes": int(activations), "step_start_bytes": int(start)}
    return out


def _steady_steps(analysis) -> set[int] | None:
    """Step indices of the steady state, as the step records number them (None: unknown)."""
    if not analysis.steps or not len(analysis.steps.steady):
        return None
    return {int(s) for s in analysis.steps.steady["step"].tolist()}


def _growth(rows: list[dict]) -> float | None:
    """Bytes allocated at a step's start, gained per step (least squares over the steps recorded)."""
    pts = [(r["step"], r["allocated"]) for r in rows if isinstance(r.get("allocated"), int)]
    if len(pts) < 2:
        return None
    x, y = np.array(pts, dtype=np.float64).T
    return float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else None


def _rising(rows: list[dict]) -> float | None:
    a = [r["allocated"] for r in rows if isinstance(r.get("allocated"), int)]
    if len(a) < 2:
        return None
    d = np.diff(np.array(a, dtype=np.float64))
    return float((d > 0).mean())


def _findings(analysis, basis) -> list[Finding]:
    m = analysis.memory
    if not m:
        return []
    out = []
    if m.get("oom") and not _survived(m):
        out.append(explain_oom(m))
    growth, rising = m.get("growth_bytes_per_step"), m.get("growth_rising_share")
    recorded = sum(1 for r in m["per_step"] if r["steady"])
    if (growth is not None and growth >= T["memory_growth_min_bytes"] and rising is not None
            and rising >= T["memory_growth_rising_share"] and recorded >= T["memory_growth_min_steps"]):
        out.append(_growth_finding(m, growth, recorded))
    if m.get("fold"):
        out.append(_fold_finding(analysis, m, basis))
    unused, reserved, total = m.get("unused_reserved_bytes"), m.get("peak_reserved_bytes"), m.get("device_total_bytes")
    expandable = "expandable_segments:true" in (m.get("alloc_conf") or "").replace(" ", "").lower()
    if (unused is not None and reserved and not expandable and unused >= T["memory_unused_reserved_min_bytes"]
            and unused >= T["memory_unused_reserved_fraction"] * reserved):
        out.append(_fragmentation_finding(m, unused, reserved, total))
    return out


def _where(lines: list[dict]) -> str:
    return "; ".join(f"{x['where']} `{x['code']}` {size(x['bytes_per_step'])} a step" if x.get("code") else
                     f"{x['where']} {size(x['bytes_per_step'])} a step" for x in lines[:3])


def _growth_finding(m: dict, growth: float, recorded: int) -> Finding:
    headroom = m.get("headroom_bytes")
    left = (f"; at this pace the {size(headroom)} left on the GPU are gone in about {int(headroom / growth):,} steps"
            if headroom and headroom > 0 else "")
    lines = m.get("growing_lines") or []
    named = f" Lines whose live memory grew in warm-up (steps {m['growing_lines_steps'][0]}-" \
            f"{m['growing_lines_steps'][1]}): {_where(lines)}." if lines else ""
    return Finding(
        kind="memory_growth",
        title=f"GPU memory grows {size(growth)} a step: allocated at each step's start rises in "
              f"{m['growth_rising_share']:.0%} of {recorded} steps{left}",
        impact_ns=0,
        fix="Keep nothing that holds a step's tensors (and its autograd graph) past the step: accumulate "
            "`loss.item()` or `loss.detach()`, not `loss`; append `.item()`s or CPU copies to lists of metrics; "
            "clear per-step caches. Effect: memory at the step's start stays flat (the step time is unchanged "
            "until the GPU fills)." + named,
        threshold=f"allocated at the step's start grows >= {size(T['memory_growth_min_bytes'])} a step, rising "
                  f"from one step to the next in >= {T['memory_growth_rising_share']:.0%} of >= "
                  f"{T['memory_growth_min_steps']} steady steps",
        evidence={"growth_bytes_per_step": growth, "steps": recorded, "lines": lines,
                  "headroom_bytes": headroom},
    )


def _fragmentation_finding(m: dict, unused: int, reserved: int, total) -> Finding:
    tight = bool(total) and reserved >= T["memory_tight_fraction"] * total
    return Finding(
        kind="memory_fragmentation",
        title=f"The caching allocator holds {size(unused)} it does not use at the peak ({unused / reserved:.0%} "
              f"of its {size(reserved)} reserve" + (f", {reserved / total:.0%} of the GPU" if total else "") + ")",
        impact_ns=0,
        fix=f"Set {FRAGMENTATION_FIX} (before the program starts CUDA): segments grow in place instead of "
            "splitting, so freed blocks are reused. Predicted: the reserve falls toward the "
            f"{size(m['peak_allocated_bytes'])} allocated at the peak" +
            (" and the run is further from out-of-memory" if tight else "") + "; the step time is unchanged.",
        threshold=f">= {T['memory_unused_reserved_fraction']:.0%} of the reserve and >= "
                  f"{size(T['memory_unused_reserved_min_bytes'])} unused at the peak, without expandable segments",
        evidence={"unused_reserved_bytes": unused, "peak_reserved_bytes": reserved,
                  "peak_allocated_bytes": m["peak_allocated_bytes"], "alloc_conf": m.get("alloc_conf")},
    )


def _fold_finding(analysis, m: dict, basis) -> Finding:
    f, total = m["fold"], m["device_total_bytes"]
    k, micro = f["factor"], m["micro_batches"]
    short = sum(s[0] for s in basis.short.values()) if basis.short else 0
    small = ((getattr(analysis.kernels, "under_one_wave", None) or {}).get("time_ns") or 0) if analysis.kernels else 0
    return Finding(
        kind="memory_headroom",
        title=f"Each step runs {micro} micro-batches (gradient accumulation) with the GPU "
              f"{m['peak_reserved_bytes'] / total:.0%} full at its peak: {k}x larger micro-batches, "
              f"{f['micro_batches_after']} a step, fit (predicted peak "
              f"{size(f['predicted_peak_allocated_bytes'])} of {size(total)})",
        impact_ns=0,  # what it would save is the idle and small kernels other findings already count
        fix=f"Raise the micro-batch {k}-fold and divide the gradient-accumulation steps by {k}: the effective batch, "
            "and what is trained, stay the same; fewer, larger kernels and launches per sample. No prediction of the "
            f"step: a trial measures it (in the window the GPU idled {ms(short)} in short gaps and ran {ms(small)} of "
            "kernels under one wave, which larger micro-batches shrink).",
        recommend={"micro_batch": k},
        threshold=f"gradient accumulation (>= 2 backward passes a step) and a micro-batch {k}x larger predicted "
                  f"under {T['memory_fold_fits_fraction']:.0%} of the device",
        evidence={**f, "micro_batches": micro, "device_total_bytes": total, "short_idle_ns": int(short),
                  "under_one_wave_ns": int(small)},
    )


OOM_LEVERS = ("a smaller micro-batch with more gradient-accumulation steps (the effective batch unchanged)",
              "activation checkpointing (torch.utils.checkpoint) on the largest blocks",
              "bf16 autocast (activations in half the bytes)",
              "zero_grad(set_to_none=True) (gradients freed between steps)",
              f"{FRAGMENTATION_FIX} where the reserve holds much unused")


def _survived(m: dict) -> bool:
    """Steps were recorded after the out-of-memory error: the program caught it and went on (cuDNN's benchmark
    trying workspaces, a batch-size search), so it is no cause of death."""
    step = m["oom"].get("step")
    return isinstance(step, int) and any(r["step"] > step for r in m.get("per_step") or [])


def add_oom(analysis, record: dict) -> None:
    """An out-of-memory record the runner read from the program's window file (the capture held none: the
    program died before its window, or after it closed): into ``memory.oom`` and the findings, as if captured."""
    if analysis.memory and analysis.memory.get("oom"):
        return
    analysis.memory = {**(analysis.memory or {"source": "oom", "per_step": []}), "oom": record}
    analysis.findings.insert(0, explain_oom(analysis.memory))
    analysis.raised_by["out_of_memory"] = QUESTION.name


def explain_oom(m: dict) -> Finding:
    """The finding for an out-of-memory record (``m``: the memory result, or just ``{"oom": record}``)."""
    o = m["oom"]
    total = o.get("device_total_bytes") or m.get("device_total_bytes")
    largest = o.get("largest") or []
    named = "; ".join((f"{x['where']} `{x['code']}` {size(x['bytes'])}" if x.get("where") else size(x["bytes"]))
                      for x in largest[:5])
    where = f"step {o.get('step')}" + (f", in {o['phase']}" if o.get("phase") else "")
    return Finding(
        kind="out_of_memory",
        title=f"The program ran out of GPU memory at {where}: it asked for {size(o.get('requested_bytes') or 0)} "
              f"with {size(o.get('allocated_bytes') or 0)} allocated and {size(o.get('reserved_bytes') or 0)} "
              "reserved by PyTorch" + (f" of the {size(o['allowed_bytes'])} the process may use (its memory "
                                       f"fraction of the GPU's {size(total)})" if o.get("allowed_bytes") else
                                       f", {size(o.get('device_free_bytes') or 0)} free of {size(total)}"
                                       if total else ""),
        impact_ns=0,
        fix="In order: " + "; ".join(f"({i}) {x}" for i, x in enumerate(OOM_LEVERS, 1)) + "."
            + (f" Largest live allocations{' by line' if any(x.get('where') for x in largest) else ''}: {named}."
               if named else ""),
        threshold="the allocator's out-of-memory observer fired",
        evidence=o,
    )


def _text(analysis, view) -> None:
    m = analysis.memory
    if not m:
        if analysis.steps:
            view.print(NOT_RECORDED, highlight=False)
        return
    if m.get("peak_allocated_bytes") is not None:
        total = m.get("device_total_bytes")
        of = f" of {size(total)}" if total else ""
        growth = m.get("growth_bytes_per_step")
        view.print(f"GPU memory (allocator, per step): peak {size(m['peak_allocated_bytes'])} allocated, "
                   f"{size(m['peak_reserved_bytes'])} reserved{of}"
                   + (f", {size(m['headroom_bytes'])} left" if m.get("headroom_bytes") is not None else "")
                   + (f"; the peak is reached in {m['peak_phase']}" if m.get("peak_phase") else "")
                   + (f"; {size(growth)} more each step" if growth and growth >= T['memory_growth_min_bytes']
                      else "; flat from step to step" if growth is not None else ""), highlight=False)
    if m.get("nsys"):
        view.print(f"GPU memory (nsys, CUDA allocations): high-water mark {size(m['nsys']['peak_bytes'])} "
                   f"over {m['nsys']['events']:,} allocation events", highlight=False)


def _html(analysis, d, view) -> str:
    m = analysis.memory
    if not m or not m.get("per_step"):
        return ""
    import pandas as pd

    rows = pd.DataFrame(m["per_step"])
    for c in ("allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
        rows[c] = rows[c].map(lambda v: size(v) if v is not None else "-")
    total = m.get("device_total_bytes")
    return view.table(rows[["step", "allocated_bytes", "reserved_bytes", "peak_allocated_bytes",
                            "peak_reserved_bytes", "peak_phase"]],
                      "GPU memory per step" + (f" (device: {size(total)})" if total else ""),
                      {"step": "step", "allocated_bytes": "allocated at start", "reserved_bytes": "reserved at start",
                       "peak_allocated_bytes": "peak allocated", "peak_reserved_bytes": "peak reserved",
                       "peak_phase": "peak in"},
                      "the caching allocator's counters, recorded by nvtx_autotrace as each step ended")


QUESTION = Question(
    name="memory", order=106, run=_run, needs=("steps", "settings", "kernels"), thresholds=THRESHOLDS, findings=_findings,
    json_keys=("memory",), json_at=119, to_json=lambda analysis: {"memory": analysis.memory},
    text=_text, text_at=73, html=_html, html_at=71,
)
