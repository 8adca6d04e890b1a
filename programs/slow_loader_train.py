"""A CPU training loop whose dataset is deliberately slow: the loop waits for data.

Run by tests/test_run.py and scripts/capture_cpu_samples.sh under ``nvtx-trace run``.
Each sample busy-waits ``--work-ms`` inside ``__getitem__`` (CPU time, like decoding
an image), two workers fetch batches of ``--batch`` samples, and the model is tiny,
so the training process spends most of each step in ``dataloader.next``.
Deterministic: sample ``i`` depends only on ``i``, the model on a fixed seed.
Prints ``step N loss X`` to stderr after every step (tests wait for these lines),
then ``done`` to stdout. ``--exit-code N`` ends with ``sys.exit(N)`` after training,
``--raise-at N`` raises RuntimeError at step N. ``--head-start-s S`` lets the workers fill a deep queue
(``--prefetch``) before the first step, as a long warm-up (compilation, a first evaluation) does, and
``--step-ms`` gives each step CPU work of its own: then steps outrun the workers until the queue is empty.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SlowPoints(Dataset):
    def __init__(self, n: int, work_ms: float, sleep: bool = False):
        self.n, self.work_s, self.sleep = n, work_ms / 1000.0, sleep

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep:  # waiting on storage or a remote store: no core taken from the training loop
            time.sleep(self.work_s)
        end = time.perf_counter() + (0.0 if self.sleep else self.work_s)
        x = 0
        while time.perf_counter() < end:  # busy, like decoding: a sleep would free the core
            for _ in range(2000):  # few clock reads: each is an OS-runtime event under nsys -t osrt
                x += 1
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), i % 4


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--work-ms", type=float, default=4.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--prefetch", type=int, default=None, help="DataLoader prefetch_factor (batches per worker)")
    p.add_argument("--head-start-s", type=float, default=0.0)
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--sleep-fetch", action="store_true", help="samples wait (I/O) instead of computing")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(SlowPoints(args.steps * args.batch, args.work_ms, args.sleep_fetch), batch_size=args.batch,
                        num_workers=args.workers, shuffle=False,
                        **({"prefetch_factor": args.prefetch} if args.prefetch and args.workers else {}))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    last = None
    batches = iter(loader)  # the workers start fetching now
    time.sleep(args.head_start_s)
    for step, (x, y) in enumerate(batches):
        if step == args.raise_at:
            raise RuntimeError(f"deliberate failure at step {step}")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        SlowPoints(0, args.step_ms)[0]  # the step's own CPU work
        opt.step()
        now = time.perf_counter()  # the step boundary nvtx_autotrace sees: the end of optimizer.step
        took = f" ms {(now - last) * 1e3:.3f}" if last is not None else ""
        last = now
        opt.zero_grad(set_to_none=True)
        print(f"step {step} loss {loss.item():.4f}{took}", file=sys.stderr, flush=True)
    print("done", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
