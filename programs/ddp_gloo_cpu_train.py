"""A tiny DistributedDataParallel CPU training loop (gloo), for ``torchrun --nproc_per_node=2``.

Run by tests/test_run.py as ``nvtx-trace run -- torchrun --nproc_per_node=2
programs/ddp_gloo_cpu_train.py``: nvtx-trace must get autotrace ranges from every rank
although it never sees the ranks' command lines (they are started by torchrun).
Each rank has its own DataLoader with one worker and a slow ``__getitem__``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slow_loader_train import SlowPoints  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--work-ms", type=float, default=2.0, help="each sample's load time")
    p.add_argument("--sleep-fetch", action="store_true", help="samples wait (I/O) instead of computing")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(SlowPoints(args.steps * 4, args.work_ms, args.sleep_fetch), batch_size=4,
                        num_workers=args.workers)
    for step, (x, y) in enumerate(loader):  # noqa: B007 - the count is printed after the loop
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"rank {rank} pid {os.getpid()} done {step + 1} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
