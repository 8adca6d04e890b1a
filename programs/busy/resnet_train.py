"""torchvision ResNet-50 training with a real CPU input pipeline, for "busy GPU" evidence.

Data: a Dataset of synthetic uint8 RGB images (a pool of --pool random 320x320 images
held in memory, standing in for decoded JPEGs), each sample through the ImageNet
train transforms on the CPU: PIL.Image.fromarray -> RandomResizedCrop(224) ->
RandomHorizontalFlip -> ToTensor -> Normalize. DataLoader with --workers (8) workers,
pin_memory=True, persistent workers, prefetch_factor 4; batches copied with
non_blocking=True. SGD (momentum 0.9, wd 1e-4), cross-entropy, 1000 classes,
cudnn.benchmark=True, batch 128.

    python programs/busy/resnet_train.py --channels-last --dtype fp32|bf16 [--compile]
    python programs/busy/resnet_train.py --loader-only     # input pipeline alone, images/s
    python programs/busy/resnet_train.py --data gpu        # no loader: four batches made once on the GPU

--data gpu measures the model alone (the GPU work of a step), as a loader that always keeps up would.

--dtype fp32 keeps PyTorch's defaults (cudnn.allow_tf32 True: convolutions already use
TF32; matmul.allow_tf32 False) unless --tf32 sets both True. --dtype bf16 wraps
forward+loss in torch.autocast('cuda', dtype=torch.bfloat16) (no GradScaler needed).

Timing and --profile-steps: as in gpt_train.py (CUDA events around each step, one
synchronize at the end). Also reports data_wait_ms: host time blocked in next(loader)
per timed step (median / mean), to show whether the loader keeps up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F
from timing import add_common_args, device_of, timed_loop


class SyntheticImages(torch.utils.data.Dataset):
    def __init__(self, length, pool, size, transform):
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (pool, size, size, 3), dtype=np.uint8)
        self.length, self.transform = length, transform

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        from PIL import Image

        img = Image.fromarray(self.images[i % len(self.images)])
        return self.transform(img), i % 1000


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pool", type=int, default=64)
    p.add_argument("--image-size", type=int, default=320, help="side of the synthetic source images")
    p.add_argument("--loader-only", action="store_true", help="time the input pipeline alone")
    p.add_argument("--data", choices=["loader", "gpu"], default="loader",
                   help="gpu: four normalized random batches made once on the GPU, no DataLoader")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="leave torch.backends.cudnn.benchmark False")
    add_common_args(p)
    args = p.parse_args(argv)
    import torchvision
    from torchvision import transforms as T

    dev, cuda = device_of(args)
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    torch.manual_seed(0)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    total = args.warmup + max(args.steps, args.profile_steps)
    if args.data == "gpu":
        g = torch.Generator(device=dev).manual_seed(0)
        pool = [(torch.randn(args.batch, 3, 224, 224, device=dev, generator=g),
                 torch.randint(0, 1000, (args.batch,), device=dev, generator=g))
                for _ in range(4)]
        it = (pool[i % len(pool)] for i in range(10**9))
    data = SyntheticImages(total * args.batch, args.pool, args.image_size, tf)
    loader = None if args.data == "gpu" else torch.utils.data.DataLoader(
        data, batch_size=args.batch, shuffle=True, drop_last=True, num_workers=args.workers, pin_memory=cuda,
        persistent_workers=args.workers > 0, prefetch_factor=4 if args.workers > 0 else None)
    if loader is not None:
        it = iter(loader)

    if args.loader_only:
        for _ in range(5):
            next(it)
        n = 0
        t0 = time.perf_counter()
        for x, _y in it:
            n += x.size(0)
        dt = time.perf_counter() - t0
        print(json.dumps({"program": "resnet_train", "loader_only": True, "images_per_s": round(n / dt, 1),
                          "batches": n // args.batch, "workers": args.workers, "batch": args.batch}), flush=True)
        return

    model = getattr(torchvision.models, args.arch)(num_classes=1000).to(dev)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    if args.compile:
        model = torch.compile(model)
    amp = args.dtype == "bf16"
    waits = []

    def step(i):
        t = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - t)
        x = x.to(dev, non_blocking=True).contiguous(memory_format=fmt)
        y = y.to(dev, non_blocking=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    res = timed_loop(step, args, cuda)
    timed_waits = [w * 1000 for w in waits[args.warmup:]]
    res.update(program="resnet_train", **vars(args),
               matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
               cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
               images_per_s=round(args.batch / (res["median_step_ms"] / 1000), 1),
               data_wait_ms_median=round(statistics.median(timed_waits), 3),
               data_wait_ms_mean=round(statistics.mean(timed_waits), 3))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
