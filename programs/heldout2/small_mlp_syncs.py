"""Held-out (issue 41, item 8): a small tabular MLP (12 residual blocks of width 256, batch 256) whose step is a few
hundred tiny kernels, with the loss read on the host every step for a running average: launch-bound."""
import argparse
import json
import time

import torch
from torch import nn


class Res(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.f = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))

    def forward(self, x):
        return x + self.f(x)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--compile", default=None, help="torch.compile mode (by hand, to check try's knob)")
    p.add_argument("--fused", action="store_true")
    a = p.parse_args()
    model = nn.Sequential(nn.Linear(64, 256), *[Res(256) for _ in range(12)], nn.Linear(256, 1)).cuda()
    if a.compile:
        model.compile(mode=None if a.compile == "default" else a.compile)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True if a.fused else None)
    x, w = torch.randn(256, 64, device="cuda"), torch.randn(64, 1, device="cuda")
    running, stamps = 0.0, []
    for step in range(a.steps):
        stamps.append(time.perf_counter())
        xb = x + 0.01 * torch.randn_like(x)
        loss = nn.functional.mse_loss(model(xb), xb @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running = 0.99 * running + 0.01 * loss.item()
        if step % 1000 == 0:
            print(f"step {step} loss {running:.4f}", flush=True)
        if step == 1500:  # the loss is read every step, so a step's wall time is its own
            gaps = sorted(b - c for b, c in zip(stamps[501:1501], stamps[500:1500]))
            print(json.dumps({"median_step_ms": 1e3 * gaps[len(gaps) // 2], "compile": a.compile, "fused": a.fused}),
                  flush=True)
