"""What each way of marking a range costs, per call, on this machine's CPU.

    python benchmarks/range_costs.py [--device cuda]
    nsys profile -t cuda,nvtx,osrt -s none --cpuctxsw none -o /tmp/rc python benchmarks/range_costs.py --device cuda

Run it plain and under nsys (the profiler changes every figure). Prints µs per
call, best of 5; asserts nothing. The figures choose nvtx_autotrace's design
and its range budget (docs/autotrace.md, "Cost").
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_us(fn, n: int, per: int = 1) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / (n * per))
    return best * 1e6


def nvtx_calls(n: int) -> dict:
    import nvtx
    from nvtx._lib import EventAttributes, RegisteredString, end_range, pop_range, push_range, start_range

    dom = nvtx.get_domain(None)
    attrs = EventAttributes(RegisteredString(dom.handle, "bench"), None, None, None)
    h = dom.handle
    return {
        "nvtx.push_range/pop_range (python API)": best_us(lambda: (nvtx.push_range("bench"), nvtx.pop_range()), n),
        "push/pop, registered string, C calls": best_us(lambda: (push_range(attrs, h), pop_range(h)), n),
        "start/end, registered string, C calls": best_us(lambda: end_range(start_range(attrs, h)), n),
    }


def module_hooks(n: int) -> dict:
    chain = nn.Sequential(*[nn.Identity() for _ in range(50)])
    x = torch.ones(1)
    per = 51
    out = {"module call, no hooks": best_us(lambda: chain(x), n // 50, per)}
    from torch.nn.modules import module as mm

    h1 = mm.register_module_forward_pre_hook(lambda m, a: None)
    h2 = mm.register_module_forward_hook(lambda m, a, o: None, always_call=True)
    out["module call, global pre+post hooks (empty)"] = best_us(lambda: chain(x), n // 50, per)
    h1.remove(), h2.remove()
    hs = [m.register_forward_pre_hook(lambda m, a: None) for m in chain] + \
         [m.register_forward_hook(lambda m, a, o: None) for m in chain]
    out["module call, own pre+post hooks (empty)"] = best_us(lambda: chain(x), n // 50, per)
    for h in hs:
        h.remove()
    return {k: v for k, v in out.items()}


def backward_hooks(device: str, n: int) -> dict:
    """Per hooked autograd node, in a real backward (on the autograd thread on CUDA)."""
    lin = nn.Linear(8, 8).to(device)
    x0 = torch.randn(2, 8, device=device, requires_grad=True)
    layers = 100

    def run(hook):
        x = x0
        for _ in range(layers):
            x = torch.tanh(lin(x))
            if hook:
                hook(x)
        x.sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()

    base = best_us(lambda: run(None), n, layers)

    def prehook(x):
        x.grad_fn.register_prehook(lambda g: None)

    def tensorhook(x):
        x.register_hook(lambda g: None)

    def two_prehooks(x):
        x.grad_fn.register_prehook(lambda g: None)
        x.grad_fn.next_functions[0][0].register_prehook(lambda g: None)

    out = {"backward node, no hook (per layer of 3 ops)": base}
    for name, h in (("grad_fn pre-hook (empty)", prehook), ("two grad_fn pre-hooks (empty)", two_prehooks),
                    ("tensor hook (empty)", tensorhook)):
        out[f"backward, added per {name}"] = best_us(lambda h=h: run(h), n, layers) - base
    seq = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(layers // 2)]).to(device)

    def full(hook):
        hs = [m.register_full_backward_hook(lambda m, gi, go: None) for m in seq] if hook else []
        seq(x0).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        for h in hs:
            h.remove()

    nmods = sum(1 for _ in seq.modules()) - 1
    out["backward, added per module full backward hook (empty)"] = (best_us(lambda: full(True), n, nmods)
                                                                    - best_us(lambda: full(False), n, nmods))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--calls", type=int, default=100_000)
    args = p.parse_args(argv)
    from nvtx_autotrace import _backend

    print(f"torch {torch.__version__}, device {args.device}, profiler attached: {_backend.injection_present()}")
    rows = {**nvtx_calls(args.calls), **module_hooks(args.calls), **backward_hooks(args.device, 50)}
    for k, v in rows.items():
        print(f"  {k:58s} {v:8.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
