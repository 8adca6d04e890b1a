"""Step time of real training programs: plain, under nsys, under `nvtx-trace run`.

    python benchmarks/overhead_table.py --programs gpt2,resnet50,resnet50_cl --repeats 3
    python benchmarks/overhead_table.py --programs cpu_transformer --repeats 5      # a CPU machine

For each program (programs/) and each configuration, interleaved
over ``--repeats`` rounds, one process per run, it reads the program's own
``BENCH step_ms=`` line (median steady-state step) and prints the median over
rounds, the overhead against plain and against nsys alone, ranges per step and
the tool's own estimate of its cost (summary.json ``instrumentation``). Prints
figures; asserts nothing.

Configurations: ``plain`` (python), ``nsys`` (`nvtx-trace run --no-autotrace`:
the same nsys flags, no ranges of ours), ``tool`` (`nvtx-trace run --full`: the whole program),
``autograd-nvtx`` (nsys's own ``--pytorch=autograd-nvtx``, where supported).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = {
    "gpt2": ["gpt2_train.py", "--steps", "16", "--warmup", "6"],
    "gpt2_compile": ["gpt2_train.py", "--compile", "--steps", "16", "--warmup", "8"],
    "resnet50": ["resnet50_train.py", "--steps", "24", "--warmup", "8"],
    "resnet50_cl": ["resnet50_train.py", "--channels-last", "--steps", "24", "--warmup", "8"],
    "resnet50_synthetic": ["resnet50_train.py", "--data", "synthetic", "--steps", "24", "--warmup", "8"],
    "hf_trainer": ["hf_trainer_train.py", "--steps", "24", "--warmup", "8"],
    "cpu_transformer": ["cpu_transformer_train.py", "--steps", "60", "--warmup", "10"],
}
CONFIGS = ("plain", "nsys", "tool", "autograd-nvtx", "tool-nobwd", "tool-ct", "nsys-ct")
BENCH = re.compile(r"^BENCH .*step_ms=([0-9.]+)", re.M)


def command(config: str, program: list[str], out: Path, nsys: str | None) -> list[str]:
    script = [str(HERE.parent / "programs" / program[0]), *program[1:]]
    if config == "plain":
        return [sys.executable, *script]
    run = [sys.executable, "-m", "nvtx_trace.cli", "run", "--full", "--out", str(out), "-f"]  # whole program
    if nsys:
        run += ["--nsys", nsys]
    if config == "nsys":
        run += ["--no-autotrace"]
    elif config == "autograd-nvtx":
        run += ["--no-autotrace", "--nsys-args", "--pytorch=autograd-nvtx"]
    elif config == "tool-ct":  # diagnostics: fewer nsys traces, no per-module backward ranges
        run += ["--trace", "cuda,nvtx"]
    elif config == "nsys-ct":
        run += ["--no-autotrace", "--trace", "cuda,nvtx"]
    return [*run, *script]


def one_run(config: str, program: list[str], nsys: str | None, env: dict, log) -> dict:
    with tempfile.TemporaryDirectory(prefix="ovh-") as tmp:
        out = Path(tmp) / "out"
        cmd = command(config, program, out, nsys)
        t0 = time.time()
        run_env = dict(env, NVTX_AUTOTRACE_BACKWARD_MODULES="0") if config == "tool-nobwd" else env
        proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env)
        text = proc.stdout + proc.stderr
        log.write(f"\n$ {' '.join(cmd)}\n{text[-4000:]}\n")
        log.flush()
        m = BENCH.findall(proc.stdout)
        row = {"step_ms": float(m[-1]) if m else None, "wall_s": time.time() - t0, "rc": proc.returncode}
        summary = out / "summary.json"
        if summary.is_file():
            inst = json.loads(summary.read_text()).get("instrumentation") or {}
            row["ranges_per_step"] = inst.get("ranges_per_step")
            row["cost_ns_per_step"] = inst.get("cost_ns_per_step")
            row["method"] = inst.get("method")
            data = json.loads(summary.read_text())
            findings = data.get("findings") or []
            tr = data.get("transposes") or {}
            if tr.get("time_ns"):  # how much transpose time the module ranges attribute, by phase
                by_phase = {}
                for m in tr.get("modules") or []:
                    by_phase[m["phase"]] = by_phase.get(m["phase"], 0) + m["time_ns"]
                row["transposes_attributed"] = {k: round(v / tr["time_ns"], 3) for k, v in by_phase.items()}
            row["findings"] = [f"{f.get('kind')}:{(f.get('impact_ns') or 0) / 1e6:.0f}ms" for f in findings[:3]]
        return row


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", default="gpt2,resnet50,resnet50_cl")
    p.add_argument("--configs", default="plain,nsys,tool,autograd-nvtx")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nsys", default=os.environ.get("NSYS"))
    p.add_argument("--log", default="overhead_runs.log")
    p.add_argument("--json", default=None, help="write every run's figures here")
    p.add_argument("--env", action="append", default=[],
                   help="KEY=VALUE for the tool's runs (e.g. NVTX_AUTOTRACE_MODULE_DEPTH=2)")
    args = p.parse_args(argv)
    programs = [s for s in args.programs.split(",") if s]
    configs = [c for c in args.configs.split(",") if c]
    for name in programs + configs:
        if name not in PROGRAMS and name not in CONFIGS:
            p.error(f"unknown program or configuration {name!r}")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p))
    env.update(kv.split("=", 1) for kv in args.env)
    runs: dict = {(pr, c): [] for pr in programs for c in configs}
    with open(args.log, "a") as log:
        for rnd in range(args.repeats):
            for pr in programs:
                for c in configs:
                    row = one_run(c, PROGRAMS[pr], args.nsys, env, log)
                    runs[(pr, c)].append(row)
                    print(f"round {rnd + 1} {pr:18s} {c:14s} step {row['step_ms']} ms  rc {row['rc']}  "
                          f"wall {row['wall_s']:.0f} s  est {row.get('cost_ns_per_step')}  "
                          f"findings {row.get('findings')}  transposes {row.get('transposes_attributed')}", flush=True)
    print("\n| program | plain ms | nsys ms | tool ms | tool vs nsys | tool vs plain | autograd-nvtx vs nsys "
          "| ranges/step | self-estimate ms | measured tool-nsys ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pr in programs:
        m = {c: med([r["step_ms"] for r in runs[(pr, c)]]) for c in configs}
        tool = runs.get((pr, "tool"), [])
        est = med([r.get("cost_ns_per_step") for r in tool])
        rps = med([r.get("ranges_per_step") for r in tool])

        def pct(a, b, m=m):
            return f"{100 * (m[a] - m[b]) / m[b]:+.1f} %" if m.get(a) and m.get(b) else "-"

        diff = f"{m['tool'] - m['nsys']:.2f}" if m.get("tool") and m.get("nsys") else "-"
        fmt = lambda v: f"{v:.2f}" if v else "-"  # noqa: E731
        print(f"| {pr} | {fmt(m.get('plain'))} | {fmt(m.get('nsys'))} | {fmt(m.get('tool'))} | {pct('tool', 'nsys')} "
              f"| {pct('tool', 'plain')} | {pct('autograd-nvtx', 'nsys')} | {fmt(rps)} "
              f"| {fmt(est / 1e6 if est is not None else None)} | {diff} |")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
