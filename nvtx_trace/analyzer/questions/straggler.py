"""Which GPU do the others wait for inside collectives, and why (from its own evidence)?

Which GPU: the one that waits least while the others spin in the same collectives (collectives.py).
Why: every step takes as long on every rank, so what the waiting GPUs spend spinning in NCCL the slow
rank spends elsewhere. Its own figures are compared with those of the GPU that waits most: its loader
waits, its kernels' time, its GPU's idle in short gaps between kernels (its CPU issues them late), and
its idle in longer gaps by cause. The largest difference is named only when it accounts for a real part
of the wait; a 1 ms loader difference does not explain 200 ms of waiting, and its fix would mislead.
"""

from __future__ import annotations

from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.measures.gpu_idle import CAUSE_FIXES
from nvtx_trace.analyzer.measures.step_times import union_of_process
from nvtx_trace.analyzer.question import Question
from nvtx_trace.analyzer.trace import intervals as iv
from nvtx_trace.units import ms, pct

MATERIAL_SHARE = 0.25  # a reason must account for this share of the most-waiting GPU's wait to be named
EVEN_OUT = "every rank waits for the last"
FIXES = {
    "loader": ("Feed the slow rank faster: more DataLoader workers per rank (see the data-loader finding), pinned "
               f"memory, or a cheaper dataset; {EVEN_OUT}"),
    "compute": ("Even out the work per rank: same batch size and sequence lengths on every rank (bucket or pad), no "
                f"extra work on one rank, the same GPU model; {EVEN_OUT}"),
    "launch": ("Cut the slow rank's CPU time per step: it issues the same kernels later than the others (CUDA "
               "graphs or torch.compile cut launches; keep logging, metrics and .item() off the loop, or on every "
               f"rank alike); {EVEN_OUT}"),
}
UNEXPLAINED = ("its own loader, kernel and idle figures do not explain it (largest difference: {what} {extra}): look "
               "at what that rank does alone (logging, evaluation, checkpoints, a busier CPU or PCIe link)")


def _findings(analysis, basis) -> list[Finding]:
    c, gpu_ns, short_idle = analysis.communication, basis.gpu_ns, basis.short
    if c is None or len(c.devices) < 2 or any(d.wait_ns is None for d in c.devices):
        return []  # one GPU, or collectives that do not pair: no one can be named
    slow = min(c.devices, key=lambda d: d.wait_ns)
    others = [d for d in c.devices if d is not slow]
    impact = int(sum(d.wait_ns - slow.wait_ns for d in others))
    if impact < THRESHOLDS["min_impact_ns"] or impact < THRESHOLDS["cause_fraction"] * gpu_ns:
        return []
    caused = sum(d.caused_wait_ns for d in c.devices)
    last_share = slow.caused_wait_ns / caused if caused else 0.0
    if last_share < THRESHOLDS["straggler_last_share"]:  # ranks take turns arriving last: jitter, no straggler
        return []
    waiter = max(others, key=lambda d: d.wait_ns)
    reasons = _reasons(analysis, slow, waiter, short_idle)
    key, what, extra, fix = max(reasons, key=lambda r: r[2])
    if extra >= MATERIAL_SHARE * (waiter.wait_ns - slow.wait_ns):
        because = f"; {what} {ms(extra)} more than GPU {waiter.device_id}'s rank in the window"
    else:
        because = "; " + UNEXPLAINED.format(what=what, extra=f"{'+' if extra >= 0 else ''}{ms(extra)}")
        key, fix = None, None
    waiters = "the other GPU waits" if len(others) == 1 else f"the other {len(others)} GPUs wait"
    return [Finding(
        kind="straggler",
        title=f"GPU {slow.device_id} (pid {slow.pid}) arrives last at collectives: {waiters} "
              f"{ms(impact)} more inside NCCL kernels than it does (waits: "
              + ", ".join(f"GPU {d.device_id} {ms(d.wait_ns)}" for d in c.devices) + ")" + because,
        impact_ns=impact, fix=fix or f"Find what the slow rank does that the others do not; {EVEN_OUT}.",
        threshold=f">= {pct(THRESHOLDS['cause_fraction'])} of the window",
        evidence={"slow_device_id": slow.device_id, "slow_rank": slow.pid,
                  "wait_ns": {str(d.device_id): d.wait_ns for d in c.devices}, "matched": c.matched,
                  "last_share": last_share, "why": key, "reasons_ns": {r[0]: int(r[2]) for r in reasons}},
    )]


def _reasons(analysis, slow, waiter, short_idle: dict[int, tuple]) -> list[tuple[str, str, int, str]]:
    """(key, what in words, how much more the slow rank has of it than the waiting one, the fix it calls for)."""
    w0, w1 = analysis.window["start_ns"], analysis.window["end_ns"]

    def loader_wait(pid: int) -> int:
        waits = analysis.loader.waits if analysis.loader is not None else None
        return int(iv.Coverage(union_of_process(waits, pid)).measure(w0, w1))

    out = [("loader_wait", "its data loader waits", loader_wait(slow.pid) - loader_wait(waiter.pid), FIXES["loader"]),
           ("compute", "its GPU computes", slow.compute_ns - waiter.compute_ns, FIXES["compute"])]
    if slow.device_id in short_idle and waiter.device_id in short_idle:
        out.append(("short_gaps", f"its GPU idles in gaps shorter than {ms(analysis.min_gap_ns)} between kernels (its "
                    "CPU issues them late)", short_idle[slow.device_id][0] - short_idle[waiter.device_id][0], FIXES["launch"]))
    causes = analysis.window_causes
    if causes is not None and len(causes):
        for cause, rows in causes.groupby("cause"):
            if cause == "dataloader":
                continue  # counted by the loader waits themselves
            per_dev = dict(zip(rows["device_id"], rows["idle_ns"]))
            label = rows["label"].iloc[0]
            out.append((f"gaps:{cause}", f"its GPU idles in longer gaps: {label}",
                        int(per_dev.get(slow.device_id, 0) - per_dev.get(waiter.device_id, 0)),
                        CAUSE_FIXES.get(cause, "").rstrip(".") + f"; on the slow rank first: {EVEN_OUT}"))
    return out


def _predicted(analysis, f: Finding) -> dict | None:
    """The other GPUs' waiting per step goes (the straggler's impact is theirs); slowed by its loader, the fix is
    more workers, as many as the cores allow."""
    return predict.idle_removed(analysis, f, of_others=True, lost="waiting inside collectives",
                                more_workers=f.evidence.get("why") == "loader_wait")


QUESTION = Question(
    name="straggler", order=112, needs=("communication", "loader", "window_figures"),
    thresholds={"straggler_last_share": 0.6},  # its lateness causes this share of all waiting (else: jitter)
    findings=_findings, idle_kinds=("straggler",), predicts={"straggler": _predicted},
)
