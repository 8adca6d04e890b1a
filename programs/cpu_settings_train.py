"""A CPU training loop with the settings the settings record exists to catch: a convolution with a bias right
before a batch norm, the model in nn.DataParallel, anomaly detection on, AdamW with foreach=False,
zero_grad(set_to_none=False), torch.cuda.empty_cache() every step (a no-op without CUDA).

Run under nsys by tests/test_settings_findings.py as ``python -m nvtx_autotrace programs/cpu_settings_train.py``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, bias=True), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    model = nn.DataParallel(net)  # without GPUs it calls the module directly
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    torch.autograd.set_detect_anomaly(True)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 4, (16,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        torch.cuda.empty_cache()
    print(f"loss {loss.item():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
