"""The step timing every program here shares: warm-up, then CUDA-event-timed (or nsys-profiled) steps."""

from __future__ import annotations

import statistics
import time

import torch


def add_common_args(p) -> None:
    """The options every program here takes: its steps, where it runs, and the TF32 and compile levers."""
    p.add_argument("--tf32", action="store_true", help="set matmul and cudnn allow_tf32 = True")
    p.add_argument("--compile", action="store_true", help="model = torch.compile(model)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--profile-steps", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (cpu only for smoke tests)")


def device_of(args):
    """The device, whether it is CUDA, and TF32 as asked (without --tf32: PyTorch's defaults)."""
    dev = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dev, dev.type == "cuda"


def timed_loop(step, args, cuda):
    """Warm-up, then timed (or profiled) steps; returns the timing dict."""
    loss = None
    for i in range(args.warmup):
        loss = step(i)
    if cuda:
        torch.cuda.synchronize()
    prof = args.profile_steps > 0
    n = args.profile_steps if prof else args.steps
    if prof:
        torch.cuda.profiler.start()
    if cuda:
        evs = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        evs[0].record()
    marks = [time.perf_counter()]
    for j in range(n):
        i = args.warmup + j
        if prof:
            torch.cuda.nvtx.range_push(f"step {i}")
        loss = step(i)
        if prof:
            torch.cuda.nvtx.range_pop()
        if cuda:
            evs[j + 1].record()
        marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - marks[0]
    if prof:
        torch.cuda.profiler.stop()
    if cuda:
        ms = [evs[j].elapsed_time(evs[j + 1]) for j in range(n)]
    else:
        ms = [(b - a) * 1000 for a, b in zip(marks, marks[1:])]
    out = {"median_step_ms": round(statistics.median(ms), 3), "mean_step_ms": round(statistics.mean(ms), 3),
           "min_step_ms": round(min(ms), 3), "max_step_ms": round(max(ms), 3), "steps": n,
           "wall_ms_per_step": round(wall * 1000 / n, 3), "timing": "cuda_events" if cuda else "perf_counter",
           "final_loss": round(float(loss.detach()), 4)}
    if cuda:
        out["gpu"] = torch.cuda.get_device_name()
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    out["torch"] = torch.__version__
    return out

