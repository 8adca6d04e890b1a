"""An ImageNet-shaped ResNet-18 trainer whose loader cannot keep up, held out from the analyzer's tuning.

Synthetic JPEG-like images (uint8 arrays in memory) through the torchvision train transforms on the CPU
(RandomResizedCrop, flip, ColorJitter, ToTensor, Normalize), --workers workers (3), batch 96, fp16 autocast
with a GradScaler, SGD with Nesterov momentum, the loss read every step (a sync): the GPU waits for each
batch, and which worker delivers it alternates, so step times do too.

    python programs/heldout/loader_bound_resnet.py --steps 80
    python programs/heldout/loader_bound_resnet.py --device cpu --steps 4 --batch 4 --workers 1   # smoke test
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F


class Images(torch.utils.data.Dataset):
    def __init__(self, n, pool, side):
        import torchvision.transforms as T

        self.n = n
        self.pool = np.random.default_rng(1).integers(0, 256, (pool, side, side, 3), dtype=np.uint8)
        self.tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
                             T.ToTensor(), T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from PIL import Image

        return self.tf(Image.fromarray(self.pool[i % len(self.pool)])), i % 1000


def main():
    import torchvision

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=96)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    loader = torch.utils.data.DataLoader(Images(a.batch * a.steps, 32, 288), batch_size=a.batch, shuffle=True,
                                         num_workers=a.workers, pin_memory=cuda, drop_last=True)
    model = torchvision.models.resnet18(num_classes=1000).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)
    scaler = torch.amp.GradScaler(enabled=cuda)
    times, t0 = [], time.perf_counter()
    for x, y in loader:
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.float16, enabled=cuda):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        _ = loss.item()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    steady = sorted(times[len(times) // 3:])
    print(json.dumps({"median_step_ms": round(1e3 * steady[len(steady) // 2], 2), "steps": len(times)}))


if __name__ == "__main__":
    main()
