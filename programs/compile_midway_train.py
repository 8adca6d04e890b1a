"""A CPU loop whose compiled model meets a new graph mid-run (an evaluation under no_grad at --eval-at steps),
as a trainer with a periodic evaluation does: that one step pays for a compilation no other step pays again.
Each step also sleeps --step-ms so the pace is steady.

    python programs/compile_midway_train.py --steps 200 --eval-at 30
"""

from __future__ import annotations

import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-at", type=int, default=30)
    p.add_argument("--step-ms", type=float, default=40.0)
    a = p.parse_args()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    for step in range(a.steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == a.eval_at:
            with torch.no_grad():
                model(torch.randn(7, 32))  # a new shape without grad: a second graph
        time.sleep(a.step_ms / 1000)


if __name__ == "__main__":
    main()
