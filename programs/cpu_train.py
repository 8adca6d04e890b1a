"""A tiny deterministic CPU training loop with nested modules and two DataLoader workers.

Run under nsys by tests/test_autotrace_nsys.py as ``python -m nvtx_autotrace
programs/cpu_train.py``, and imported by the unit tests (``train()``) to
compare losses with and without the patches. Prints one line per step:
``loss <step> <float.hex()>`` so bitwise equality is easy to check.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class TinyNet(nn.Module):
    def __init__(self, dim: int = 16, classes: int = 4):
        super().__init__()
        self.stem = nn.Linear(8, dim)
        self.blocks = nn.Sequential(Block(dim), Block(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.blocks(F.relu(self.stem(x))))


class Points(Dataset):
    """Deterministic samples: sample i depends only on i."""

    def __init__(self, n: int, sample_ms: float = 0.0):
        self.n = n
        self.sample_ms = sample_ms  # CPU-side work per sample (a sleep): longer, steadier steps

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sample_ms:
            time.sleep(self.sample_ms / 1000)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), i % 4


def train(steps: int = 6, workers: int = 2, batch: int = 8, start_method: str | None = None,
          persistent: bool = False, sample_ms: float = 0.0) -> list[float]:
    torch.manual_seed(0)
    data = Points(steps * batch, sample_ms)
    kwargs = {}
    if workers and start_method:
        kwargs["multiprocessing_context"] = start_method
    loader = DataLoader(data, batch_size=batch, shuffle=False, num_workers=workers,
                        persistent_workers=persistent and workers > 0, **kwargs)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in loader:
        x = x.to(torch.float32)  # a dtype conversion, as loops do: passes the Tensor.to wrapper
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default=None)
    p.add_argument("--sample-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    losses = train(args.steps, args.workers, start_method=args.start_method, sample_ms=args.sample_ms)
    for i, loss in enumerate(losses):
        print(f"loss {i} {loss.hex()}")
    print(f"pid {os.getpid()} injection={bool(os.environ.get('NVTX_INJECTION64_PATH'))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
