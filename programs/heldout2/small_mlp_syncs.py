"""Held-out (issue 41, item 8): a small tabular MLP (12 residual blocks of width 256, batch 256) whose step is a few
hundred tiny kernels, with the loss read on the host every step for a running average: launch-bound."""
import argparse

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
    a = p.parse_args()
    model = nn.Sequential(nn.Linear(64, 256), *[Res(256) for _ in range(12)], nn.Linear(256, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, w = torch.randn(256, 64, device="cuda"), torch.randn(64, 1, device="cuda")
    running = 0.0
    for step in range(a.steps):
        xb = x + 0.01 * torch.randn_like(x)
        loss = nn.functional.mse_loss(model(xb), xb @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        running = 0.99 * running + 0.01 * loss.item()
        if step % 1000 == 0:
            print(f"step {step} loss {running:.4f}", flush=True)
