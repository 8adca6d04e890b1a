"""What nvtx_autotrace's memory record costs a step, on the GPU machine (prints figures; asserts nothing).

1. The counters themselves: one read of the allocator's stats and one peak reset, in µs (what each step pays).
2. The memory record's own code, timed inside a real run (programs/memory/memory_train.py in this process,
   nvtx_autotrace installed, the record's step-boundary and phase callbacks wrapped in a clock): µs a step, median
   over the steps after warm-up, and the share of the step; and what the peaks folded back add to the program's
   own ``torch.cuda.max_memory_allocated()``. Not blurred by run-to-run noise (a few % between processes).
3. The step, as the program times it with CUDA events: programs/memory/memory_train.py under
   ``python -m nvtx_autotrace`` with ranges on, memory record off / on (stacks in warm-up only) / on with stacks
   recorded every step; interleaved repeats, the median of each run's steps after warm-up, then the median.

    python benchmarks/bench_memory.py --repeats 3 --steps 80
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "..", "programs", "memory", "memory_train.py")
VARIANTS = {
    "memory off": {"NVTX_AUTOTRACE_MEMORY": "0"},
    "memory on (stacks in warm-up)": {"NVTX_AUTOTRACE_MEMORY": "1"},
    "memory on, stacks every step": {"NVTX_AUTOTRACE_MEMORY": "1", "NVTX_AUTOTRACE_MEMORY_HISTORY": "all"},
}


def counters(n: int = 2000) -> dict:
    import torch

    x = torch.randn(1 << 20, device="cuda")
    del x
    t0 = time.perf_counter()
    for _ in range(n):
        torch._C._cuda_memoryStats(0)
    read = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        torch._C._cuda_resetPeakMemoryStats(0)
    reset = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        torch.cuda.max_memory_allocated()
    public = (time.perf_counter() - t0) / n
    return {"stats_read_us": round(read * 1e6, 2), "peak_reset_us": round(reset * 1e6, 2),
            "max_memory_allocated_us": round(public * 1e6, 2)}


IN_PROCESS = r"""
import json, os, runpy, statistics, sys, time
os.environ["NVTX_AUTOTRACE"] = "0"
import torch
import nvtx_autotrace
from nvtx_autotrace import memory, steps
per_step, parts = {}, {}
def timed(fn, into=None):
    def wrapper(*args, **kwargs):
        t = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            n = steps.current_step()
            d = per_step if into is None else parts.setdefault(into, {})
            d[n] = d.get(n, 0) + time.perf_counter_ns() - t
    return wrapper
memory._boundary, memory.at_phase = timed(memory._boundary), timed(memory.at_phase)
memory._stats, memory._reset_peaks = timed(memory._stats, "stats"), timed(memory._reset_peaks, "reset")
torch.cuda.is_current_stream_capturing = timed(torch.cuda.is_current_stream_capturing, "capturing")
def public(n=500):
    t = time.perf_counter_ns()
    for _ in range(n):
        torch.cuda.max_memory_allocated()
    return (time.perf_counter_ns() - t) / n / 1e3
torch.ones(1, device="cuda")
plain_us = public()
nvtx_autotrace.install(enabled="1")
sys.argv = [PROGRAM, *ARGS]
try:
    runpy.run_path(PROGRAM, run_name="__main__")
finally:
    folded_us = public()
    skip = SKIP
    spent = [v / 1e3 for k, v in sorted(per_step.items()) if k >= skip]
    of = {k: round(statistics.median([v / 1e3 for n, v in d.items() if n >= skip] or [0]), 1) for k, d in parts.items()}
    print(json.dumps({"record_us_per_step_median": round(statistics.median(spent), 1) if spent else None,
                      "of_which_us": of,
                      "record_us_per_step_max": round(max(spent), 1) if spent else None, "steps": len(spent),
                      "max_memory_allocated_us": {"plain": round(plain_us, 1), "peaks_folded_back": round(folded_us, 1)}}))
"""


def in_process(steps: int, skip: int, extra: list[str]) -> dict:
    code = (IN_PROCESS.replace("PROGRAM", repr(PROGRAM)).replace("ARGS", repr(["--steps", str(steps), *extra]))
            .replace("SKIP", str(skip)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    ms = [x["ms"] for x in lines if "ms" in x][skip:]
    out = lines[-1]
    step_us = statistics.median(ms) * 1e3 if ms else None
    out["step_ms_median"] = round(step_us / 1e3, 3) if step_us else None
    out["record_share_of_step_pct"] = (round(100 * out["record_us_per_step_median"] / step_us, 3)
                                       if step_us and out.get("record_us_per_step_median") else None)
    return out


def one(env: dict, steps: int, skip: int, extra: list[str]) -> float:
    cmd = [sys.executable, "-m", "nvtx_autotrace", PROGRAM, "--steps", str(steps), *extra]
    out = subprocess.run(cmd, env={**os.environ, "NVTX_AUTOTRACE": "1", **env}, capture_output=True, text=True,
                         check=True).stdout
    ms = [json.loads(line)["ms"] for line in out.splitlines() if line.startswith("{")]
    return statistics.median(ms[skip:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--skip", type=int, default=20, help="warm-up steps left out of each run's median")
    p.add_argument("--program-args", default="--micro-batch 8")
    args = p.parse_args()
    print(json.dumps({"counters": counters()}))
    print(json.dumps({"in_process": in_process(args.steps, args.skip, args.program_args.split())}))
    if args.repeats <= 0:
        return
    runs: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for _ in range(args.repeats):
        for name, env in VARIANTS.items():
            runs[name].append(one(env, args.steps, args.skip, args.program_args.split()))
    base = statistics.median(runs["memory off"])
    for name, values in runs.items():
        med = statistics.median(values)
        print(json.dumps({"variant": name, "step_ms_median": round(med, 3), "runs": values,
                          "vs_off_pct": round(100 * (med / base - 1), 2)}))


if __name__ == "__main__":
    main()
