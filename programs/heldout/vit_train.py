"""A ViT-B/16 image classifier trainer, held out from every rule the analyzer was tuned on (written 2026-11-26).

torchvision's vit_b_16 (random weights) at 224x224, AdamW with weight decay, label-smoothed cross-entropy, a
warm-up-then-cosine learning rate, clip_grad_norm_, and a DataLoader over an in-memory uint8 image store whose
dataset crops, flips and normalizes on the CPU (4 workers, pinned, non-blocking copies). PyTorch's defaults
otherwise: fp32 with TF32 off for matmuls. --tf32, --bf16 (autocast) and --compile are the levers a busy-GPU
finding may advise; the JSON line gives the mean steady step (the last two thirds, timed between
two synchronizes).

    python programs/heldout/vit_train.py --steps 100
    python programs/heldout/vit_train.py --device cpu --tiny --steps 4     # smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F
import torchvision


class Images(torch.utils.data.Dataset):
    """A random 224 crop and a flip of a stored 256x256 uint8 image, normalized, with its label."""

    def __init__(self, n: int, size: int, classes: int):
        g = torch.Generator().manual_seed(0)
        self.store = torch.randint(0, 256, (n, 3, size + size // 7, size + size // 7), dtype=torch.uint8,
                                   generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.size = size
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        img = self.store[i % len(self.store)]
        top, left = (int(v) for v in torch.randint(0, img.shape[1] - self.size + 1, (2,)))
        img = img[:, top:top + self.size, left:left + self.size].float().div_(255)
        if torch.rand(()) < 0.5:
            img = img.flip(2)
        return (img - self.mean) / self.std, self.labels[i % len(self.labels)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a 2-layer ViT at 64x64 (smoke test)")
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16) around forward and loss")
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    if a.tf32:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    size, classes = (64, 100) if a.tiny else (224, 1000)
    model = (torchvision.models.VisionTransformer(size, 16, 2, 4, 128, 256, num_classes=classes) if a.tiny
             else torchvision.models.vit_b_16(num_classes=classes)).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
    warm = max(1, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / a.steps)))
    step_fn = torch.compile(model) if a.compile else model
    loader = torch.utils.data.DataLoader(Images(256, size, classes), batch_size=a.batch, num_workers=a.workers,
                                         pin_memory=a.device == "cuda", persistent_workers=a.workers > 0)
    batches = iter(loader)
    first = a.steps // 3  # the steady steps are timed as a whole, between two synchronizes
    for step in range(a.steps):
        if step == first:
            if a.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = next(batches)
        x, y = x.to(a.device, non_blocking=True), y.to(a.device, non_blocking=True)
        with torch.autocast(a.device, torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(step_fn(x), y, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    if a.device == "cuda":
        torch.cuda.synchronize()
    mean = (time.perf_counter() - t0) / (a.steps - first)
    print(json.dumps({"mean_step_ms": round(1e3 * mean, 2), "steps": a.steps,
                      "tf32": a.tf32, "bf16": a.bf16, "compile": a.compile}))


if __name__ == "__main__":
    main()
