"""An image-folder classifier shaped like timm's train.py: real JPEGs decoded and augmented by DataLoader workers
every epoch, ResNet-50, and the speed options on its command line (``-j``, ``--pin-mem``, ``--amp``,
``--amp-dtype``, ``--channels-last``), all off or low by default.

    python programs/options/image_folder_train.py -j 4
    python programs/options/image_folder_train.py -j 14 --pin-mem --amp --amp-dtype bfloat16 --channels-last

The images (``--images`` of them, 256x256, smooth random shapes) are written once into ``--data`` (default: a
folder in the temp directory) and reused. Workers are not persistent, as timm's loader is: they restart at every
epoch. Prints one JSON line at the end: the median and the mean step over the steps after ``--warmup``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def make_images(folder: Path, count: int, classes: int = 10) -> None:
    """Smooth random images, saved as JPEG at quality 90, one folder per class (ImageFolder's layout)."""
    import numpy as np
    from PIL import Image

    done = folder / f".done-{count}"
    if done.exists():
        return
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = folder / f"class{i % classes}"
        sub.mkdir(parents=True, exist_ok=True)
        low = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(low).resize((256, 256), Image.BICUBIC)
        image.save(sub / f"{i:06d}.jpg", quality=90)
    done.touch()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "nvtx-trace-image-folder"))
    p.add_argument("--images", type=int, default=3200)
    p.add_argument("-b", "--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--warmup", type=int, default=15, help="steps left out of the printed figures")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("-j", "--workers", type=int, default=4, help="DataLoader worker processes")
    p.add_argument("--pin-mem", action="store_true", default=False, help="pin the batches' memory")
    p.add_argument("--amp", action="store_true", default=False, help="mixed precision (autocast)")
    p.add_argument("--amp-dtype", default="float16", type=str, help="float16 or bfloat16")
    p.add_argument("--channels-last", action="store_true", default=False, help="channels_last memory layout")
    args = p.parse_args(argv)
    import torchvision
    from torchvision import transforms

    data = Path(args.data)
    make_images(data, args.images)
    augment = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                  transforms.ToTensor(), transforms.Normalize([0.485, 0.456, 0.406],
                                                                              [0.229, 0.224, 0.225])])
    dataset = torchvision.datasets.ImageFolder(str(data), transform=augment)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=args.pin_mem)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=10).cuda()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp and dtype == torch.float16)
    times, step, last = [], 0, None
    for _epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            if args.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=dtype, enabled=args.amp):
                loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 20 == 0:
                torch.cuda.synchronize()
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            now = time.perf_counter()
            if last is not None and step > args.warmup:
                times.append((now - last) * 1e3)
            last, step = now, step + 1
    torch.cuda.synchronize()
    print(json.dumps({"program": "image_folder", "args": vars(args), "median_step_ms": statistics.median(times),
                      "mean_step_ms": statistics.fmean(times)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
