"""What the budgeted module ranges cost, step by step, in one process: off and on interleaved.

    nsys profile -t nvtx,osrt -s none --cpuctxsw none -o /tmp/ab python benchmarks/autotrace_ab.py
    python benchmarks/autotrace_ab.py --program gpt2 --device cuda      # on a GPU, under nsys

Machines whose speed drifts (shared VMs: plain runs of the same program vary by
±20 % between processes here) hide a 1-2 % cost in process-to-process
comparisons (benchmarks/overhead_table.py). Here the default instrumentation is
installed once; after its budget chose the module ranges (steps 1-3), steps run
alternately with those ranges on and off (the class wrappers stay in place, so
no type changes between rounds: re-patching classes every round deoptimizes
CPython's specialized bytecode and measures that instead), ABBA-ordered, many
rounds; the median of the paired differences is the cost. Next to it, the
tool's self-estimate: its calibrated unit costs times the module ranges one step
emits. ``--null`` (both sides off) shows the method's own floor. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "programs")]

import nvtx_autotrace  # noqa: E402
from nvtx_autotrace import _backend, budget, classwrap  # noqa: E402


def program(name: str, device: str):
    """(model, step function) shaped like programs/<name>."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "cpu_transformer":
        from cpu_transformer_train import TinyLM

        model = TinyLM().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            idx = torch.randint(0, 512, (8, 33), generator=g).to(device)
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()

        return model, step
    from gpt2_train import GPT

    small = device == "cpu"  # a launch-bound GPT-2-shaped model on a CPU; GPT-2 small on a GPU
    layers, d, heads, ctx, vocab, batch = (4, 64, 4, 32, 512, 2) if small else (12, 768, 12, 1024, 50304, 8)
    model = GPT(vocab, ctx, layers, d, heads).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4)
    amp = torch.autocast(device, dtype=torch.bfloat16)

    def step():
        for _ in range(4):  # gradient accumulation
            x = torch.randint(0, vocab, (batch, ctx + 1), generator=g).to(device)
            x, y = x[:, :-1].contiguous(), x[:, 1:].contiguous()
            with amp:
                _, loss = model(x, y)
            (loss / 4).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return model, step


class Counting:
    """Backend shim: forwards to the real backend and counts ranges by kind."""

    def __init__(self):
        self.fwd = self.bwd = self.other = 0

    def functions(self):
        push, pop, start, end, warm = _backend.push, _backend.pop, _backend.start, _backend.end, _backend.warm

        def cpush(name):
            if name.startswith("forward "):
                self.fwd += 1
            else:
                self.other += 1
            push(name)

        def cstart(name):
            if name.startswith("backward "):
                self.bwd += 1
            else:
                self.other += 1
            return start(name)

        return cpush, pop, cstart, end, warm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program", choices=["cpu_transformer", "gpt2"], default="cpu_transformer")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--budget-pct", type=float, default=None)
    p.add_argument("--no-backward-modules", action="store_true")
    p.add_argument("--null", action="store_true", help="both sides off: the method's own noise floor")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, step = program(args.program, args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    opts = {"enabled": "1"} | ({"budget_pct": args.budget_pct} if args.budget_pct else {}) \
        | ({"backward_modules": False} if args.no_backward_modules else {})
    nvtx_autotrace.uninstall()
    nvtx_autotrace.install(**opts)
    for _ in range(5):  # step 0, counting steps, calibration: the budget settles
        step()
    record = budget.current_record()
    chosen = [(s, s.with_backward) for s in classwrap.slots() if s.ranged]

    def ranged(on: bool) -> None:
        for slot, with_backward in chosen:
            slot.ranged, slot.with_backward = on, on and with_backward

    counter = Counting()
    _backend.use(counter)
    step()
    _backend.use("nvtx" if _backend.injection_present() else "none")
    per_step = {"fwd": counter.fwd, "bwd": counter.bwd, "other": counter.other}
    estimate = per_step["fwd"] * record["module_forward_ns"] + per_step["bwd"] * record["module_backward_ns"]

    times = {"off": [], "on": []}
    for r in range(args.rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):  # ABBA: no order effect
            ranged(mode == "on" and not args.null)
            step()  # untimed: the first step after a switch
            sync()
            t0 = time.perf_counter_ns()
            step()
            sync()
            times[mode].append(time.perf_counter_ns() - t0)
    nvtx_autotrace.uninstall()
    off, on_ = statistics.median(times["off"]), statistics.median(times["on"])
    paired = statistics.median(b - a for a, b in zip(times["off"], times["on"]))
    print(f"{args.program} on {args.device}, profiler attached: {_backend.injection_present()}, "
          f"{args.rounds} rounds" + (" (null experiment: both sides off)" if args.null else ""))
    print(f"  budget chose: forward depth {record['forward_depth']}, backward depth {record['backward_depth']} "
          f"of {record['max_depth']}; {record['modules_ranged']} modules; units fwd {record['module_forward_ns']} ns, "
          f"bwd {record['module_backward_ns']} ns, range {record['range_ns']} ns")
    print(f"  ranges per step: {per_step}")
    print(f"  step off {off / 1e6:.3f} ms, on {on_ / 1e6:.3f} ms; paired difference {paired / 1e6:+.3f} ms "
          f"({100 * paired / off:+.2f} %); self-estimate {estimate / 1e6:.3f} ms ({100 * estimate / off:.2f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
