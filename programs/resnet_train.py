"""A ResNet-18-style training loop with the classic input-pipeline mistakes, or without them.

    python programs/resnet_train.py --variant flawed   # NCHW + fp16 autocast, pageable batches, 1 slow worker,
                                                       # .item() every step
    python programs/resnet_train.py --variant fixed    # channels_last, pin_memory + non_blocking, enough workers
    torchrun --nproc_per_node=2 programs/resnet_train.py   # DistributedDataParallel, one GPU per rank

It needs no torchvision and no data set: images are synthetic and each sample
costs ``--sample-ms`` of CPU time, like JPEG decoding would. The sample reports
in ``sample_reports/`` were captured from this script (see that folder's README).
``--user-ranges`` adds hand-written NVTX ranges (``step N``, ``data``, ...), the
way many training scripts already do, for analyzing reports without
nvtx_autotrace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 100, width: int = 64):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(w, w), BasicBlock(w, w))
        self.layer2 = nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w))
        self.layer3 = nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w))
        self.layer4 = nn.Sequential(BasicBlock(4 * w, 8 * w, 2), BasicBlock(8 * w, 8 * w))
        self.fc = nn.Linear(8 * w, num_classes)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SlowImages(Dataset):
    """Synthetic images whose every sample costs CPU time, like decoding a JPEG."""

    def __init__(self, n: int, size: int, classes: int, sample_ms: float):
        self.n, self.size, self.classes, self.sample_ms = n, size, classes, sample_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        deadline = time.perf_counter() + self.sample_ms / 1000
        g = torch.Generator().manual_seed(i)
        img = torch.rand(3, self.size, self.size, generator=g)
        while time.perf_counter() < deadline:  # busy like a decoder, not asleep
            pass
        return img, i % self.classes


def user_range(name: str, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    import nvtx

    return nvtx.annotate(name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", choices=["flawed", "fixed"], default="flawed")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (64 = ResNet-18)")
    p.add_argument("--sample-ms", type=float, default=1.0, help="CPU cost of one sample")
    p.add_argument("--workers", type=int, default=None, help="default: 1 (flawed) or 10 (fixed)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--user-ranges", action="store_true", help="add hand-written NVTX ranges")
    args = p.parse_args(argv)

    fixed = args.variant == "fixed"
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun
    if world > 1:
        import torch.distributed as dist

        if cuda:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
    workers = args.workers if args.workers is not None else (10 if fixed else 1)
    torch.manual_seed(0)
    if cuda:
        torch.backends.cudnn.benchmark = True

    data = SlowImages(args.steps * args.batch_size * world, args.image_size, 100, args.sample_ms)
    sampler = DistributedSampler(data, shuffle=True) if world > 1 else None
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=fixed and cuda,
        persistent_workers=fixed and workers > 0,
        prefetch_factor=4 if (fixed and workers > 0) else (2 if workers > 0 else None),
    )
    model = ResNet18(width=args.width).to(device)
    fmt = torch.channels_last if fixed else torch.contiguous_format
    model = model.to(memory_format=fmt)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=cuda)
    amp = torch.autocast(device.type, dtype=torch.float16 if cuda else torch.bfloat16)

    t0 = time.perf_counter()
    it = iter(loader)
    losses = []
    marks = [t0]
    for step in range(args.steps):
        with user_range(f"step {step}", args.user_ranges):
            with user_range("data", args.user_ranges):
                x, y = next(it)
            x = x.to(device, non_blocking=fixed, memory_format=fmt)
            y = y.to(device, non_blocking=fixed)
            with amp, user_range("forward", args.user_ranges):
                loss = F.cross_entropy(model(x), y)
            with user_range("backward", args.user_ranges):
                scaler.scale(loss).backward()
            with user_range("optimizer", args.user_ranges):
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
            if not fixed:
                losses.append(loss.item())  # a host sync every step
            else:
                losses.append(loss.detach())
        marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    last = float(losses[-1])
    steady = sorted(b - a for a, b in list(zip(marks, marks[1:]))[min(5, args.steps - 1):])
    median = steady[len(steady) // 2] * 1000 if steady else float("nan")
    rank = f"rank {os.environ.get('RANK', '0')}/{world} " if world > 1 else ""
    print(f"{rank}{args.variant}: {args.steps} steps in {dt:.2f} s, steady-state median {median:.2f} ms/step "
          f"(steps >= 5, host clock), last loss {last:.4f}")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
