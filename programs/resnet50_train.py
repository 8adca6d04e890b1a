"""An ImageNet-example-shaped ResNet-50 trainer: torchvision model, fp32, SGD.

Images are random JPEG-sized uint8 arrays decoded through real torchvision CPU
transforms (RandomResizedCrop, flip, ToTensor, Normalize) in DataLoader workers
with pinned memory, as the public ImageNet example does; ``--data synthetic``
keeps one batch on the GPU instead (no loader: the instrumentation's cost alone).

    python programs/resnet50_train.py [--channels-last] [--workers 12] [--data synthetic]

Prints one ``BENCH`` line: the median step time after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """Random 320x256 RGB images through the ImageNet example's training transforms."""

    def __init__(self, n: int, size: int):
        from torchvision import transforms

        self.n = n
        self.tf = transforms.Compose([
            transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
            transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        rng = np.random.default_rng(i)
        img = Image.fromarray(rng.integers(0, 256, (256, 320, 3), dtype=np.uint8))
        return self.tf(img), int(rng.integers(0, 1000))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--data", choices=["loader", "synthetic"], default="loader")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.resnet50().to(device, memory_format=fmt)
    criterion = nn.CrossEntropyLoss().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    total = args.warmup + args.steps
    if args.data == "loader":
        loader = DataLoader(RandomImages(total * args.batch_size, args.image_size), batch_size=args.batch_size,
                            shuffle=True, num_workers=args.workers, pin_memory=True, drop_last=True,
                            persistent_workers=False)
    else:
        batch = (torch.randn(args.batch_size, 3, args.image_size, args.image_size),
                 torch.randint(0, 1000, (args.batch_size,)))
        loader = [batch] * total
    model.train()
    times = []
    t0 = time.perf_counter()
    for i, (images, target) in enumerate(loader):
        images = images.to(device, non_blocking=True).contiguous(memory_format=fmt)
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 10 == 0:
            print(f"[{i}] loss {loss.item():.4f}", flush=True)  # the example logs every print_freq steps
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e3)
        t0 = t1
    med = statistics.median(times[args.warmup:])
    mean = statistics.fmean(times[args.warmup:])
    print(f"BENCH program=resnet50{'_cl' if args.channels_last else ''} step_ms={med:.3f} step_ms_mean={mean:.3f} "
          f"steps={len(times) - args.warmup}", flush=True)
    print("STEPS_MS " + " ".join(f"{t:.1f}" for t in times), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
