"""A loop with no optimizer (inference-like): nvtx_autotrace never sees a training step.

Run by tests/test_default_window.py under ``nvtx-trace run``: batches come from a DataLoader
(its waits are the only rhythm the report has), each goes through a small model, for
``--seconds`` seconds. Prints ``batch N`` to stderr every 50 batches and ``done`` at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:  # busy, like decoding
            pass
        return torch.full((8,), float(i % 7))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=600.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    deadline = time.perf_counter() + args.seconds
    with torch.no_grad():
        for n, x in enumerate(DataLoader(Points(), batch_size=4, num_workers=0)):
            model(x)
            if n % 50 == 0:
                print(f"batch {n}", file=sys.stderr, flush=True)
            if time.perf_counter() > deadline:
                break
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
