"""A DistributedDataParallel trainer on NCCL, one GPU per rank, whose data pipeline can be made slow on one rank.

Each rank trains a small MLP on batches from its own DataLoader; every sample costs ``--work-ms`` of
CPU time in ``__getitem__`` (as decoding an image would), times ``--slow-factor`` on ``--slow-rank``.
With a slow rank, the others wait for it inside the gradient all-reduce every step: the straggler
the analyzer must name. Captured for sample_reports/ with scripts/capture_ddp_samples.sh:

    torchrun --nproc_per_node=2 programs/ddp_train.py --steps 50 [--slow-rank 1]

Prints one ``BENCH`` line per rank: its median and mean step time after ``--warmup`` steps (a loader that
delivers in bursts makes the median hide the long steps; throughput follows the mean).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class CostlySamples(Dataset):
    """Deterministic samples that each take ``work_s`` of CPU time to produce."""

    def __init__(self, n: int, dim: int, work_s: float):
        self.n, self.dim, self.work_s = n, dim, work_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), int(torch.randint(0, 10, (1,), generator=g))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--work-ms", type=float, default=0.2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=6.0)
    args = p.parse_args(argv)
    dist.init_process_group("nccl")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(args.dim, args.dim), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.dim, 10)).to(device),
                                                device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    work = args.work_ms / 1000 * (args.slow_factor if rank == args.slow_rank else 1.0)
    total = args.warmup + args.steps
    loader = DataLoader(CostlySamples(total * args.batch_size, args.dim, work), batch_size=args.batch_size,
                        num_workers=args.workers, pin_memory=True, drop_last=True)
    times, t0 = [], time.perf_counter()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e3)
        t0 = t1
    med, mean = statistics.median(times[args.warmup:]), statistics.fmean(times[args.warmup:])
    print(f"BENCH program=ddp rank={rank} step_ms={med:.3f} step_ms_mean={mean:.3f} steps={len(times)} "
          f"slow_rank={args.slow_rank}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
