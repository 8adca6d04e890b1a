"""What nvtx_autotrace costs: per range, per module call, and per training step.

    python benchmarks/autotrace_overhead.py                      # CPU, small model
    nsys profile -t nvtx -s none --cpuctxsw none -o /tmp/b python benchmarks/autotrace_overhead.py
    python benchmarks/autotrace_overhead.py --device cuda --model resnet18 --batch-size 64

Run it plain for the cost without a profiler, and under nsys (which sets
NVTX_INJECTION64_PATH) for the cost with one. Prints figures; asserts nothing.
Step times compare, in one process, alternating to share thermal and cache state:
off (uninstalled), ranges without per-module backward ranges, and everything.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "programs"))

import nvtx_autotrace  # noqa: E402
from nvtx_autotrace import _backend  # noqa: E402


class SmallNet(nn.Module):
    """A small CNN with ResNet-like nesting (about 30 modules), cheap enough for a CPU."""

    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()

        def block(c):
            return nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                 nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))

        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.ModuleList([block(width) for _ in range(4)])
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = F.relu(x + b(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def per_call_us(fn, n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def micro(n: int) -> None:
    print("per-call costs (best of 5, µs):")
    nvtx_autotrace.uninstall()
    _backend.use("nvtx")
    push, pop = _backend.push, _backend.pop
    print(f"  one push/pop range through the backend        {per_call_us(lambda: (push('bench'), pop()), n):7.3f}")
    start, end = _backend.start, _backend.end
    print(f"  one start/end range through the backend       {per_call_us(lambda: end(start('bench')), n):7.3f}")
    _backend.use("none")

    chain = nn.Sequential(*[nn.Sequential(nn.ReLU(), nn.ReLU()) for _ in range(16)])  # 49 modules
    calls = sum(1 for _ in chain.modules())
    x = torch.ones(1)
    xg = torch.ones(1, requires_grad=True)
    t = torch.ones(4)
    results = {}
    for label, opts in (("off", None), ("ranges, no backward modules", {"backward_modules": False}),
                        ("ranges + backward modules", {})):
        nvtx_autotrace.uninstall()
        if opts is not None:
            nvtx_autotrace.install(enabled="1", **opts)
        results[label] = (
            per_call_us(lambda: chain(x), n // 50) / calls,
            per_call_us(lambda: chain(xg * 1.0), n // 50) / calls,
            per_call_us(lambda: t.to(torch.float32), n),
            per_call_us(lambda: t[0].item(), n),
        )
    nvtx_autotrace.uninstall()
    base = results["off"]
    print(f"  {'':44s}{'module (no grad)':>17s}{'module (grad)':>15s}{'Tensor.to(dtype)':>18s}{'cpu .item()':>13s}")
    for label, r in results.items():
        cells = "".join(f"{v:>+15.2f}  " if label != "off" else f"{v:>15.2f}  "
                        for v in ([a - b for a, b in zip(r, base)] if label != "off" else r))
        print(f"  {label + (' (added)' if label != 'off' else ''):44s}{cells}")


def make_model(name: str):
    if name == "resnet18":
        from resnet_train import ResNet18

        return ResNet18(), 224
    return SmallNet(), 32


def step_times(args) -> None:
    device = torch.device(args.device)
    torch.manual_seed(0)
    model, size = make_model(args.model)
    size = args.image_size or size
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def one_step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    modes = {"off": None, "ranges, no backward modules": {"backward_modules": False},
             "ranges + backward modules": {}}
    times = {m: [] for m in modes}
    for _ in range(3):  # warm-up
        one_step()
    sync()
    for _round in range(args.rounds):
        for mode, opts in modes.items():
            nvtx_autotrace.uninstall()
            if opts is not None:
                nvtx_autotrace.install(enabled="1", **opts)
            one_step()
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                one_step()
            sync()
            times[mode].append((time.perf_counter() - t0) / args.steps * 1e3)
    nvtx_autotrace.uninstall()
    n_mod = sum(1 for _ in model.modules())
    base = statistics.median(times["off"])
    print(f"step time, {args.model} ({n_mod} modules), batch {args.batch_size}, {device.type}, "
          f"median of {args.rounds} rounds x {args.steps} steps:")
    for mode, ts in times.items():
        med = statistics.median(ts)
        extra = "" if mode == "off" else f"  ({med - base:+.3f} ms, {100 * (med - base) / base:+.1f} %)"
        print(f"  {mode:30s} {med:9.3f} ms{extra}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", choices=["small", "resnet18"], default="small")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=200_000, help="calls per micro-benchmark")
    p.add_argument("--skip-micro", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    profiler = _backend.injection_present()
    print(f"torch {torch.__version__}; profiler attached (NVTX injection): {'yes' if profiler else 'no'}")
    if not args.skip_micro:
        micro(args.calls)
    step_times(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
