"""Held-out (issue 41, item 8): a timm ConvNeXt-Tiny trained with the most common first loader, num_workers=0:
each item is decoded from a uint8 array and augmented on the CPU (crop, flip, normalize) in the main process."""
import argparse

import numpy as np
import timm
import torch


class Arrays(torch.utils.data.Dataset):
    def __init__(self):
        self.store = np.random.default_rng(0).integers(0, 255, (512, 256, 256, 3), dtype=np.uint8)

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        img = torch.from_numpy(self.store[i % 512]).permute(2, 0, 1).float().div(255)
        y0, x0 = np.random.randint(0, 33, 2)
        img = img[:, y0:y0 + 224, x0:x0 + 224]
        if np.random.rand() < 0.5:
            img = img.flip(-1)
        return (img - 0.45) / 0.225, i % 1000


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args()
    loader = torch.utils.data.DataLoader(Arrays(), batch_size=64, shuffle=True)
    model = timm.create_model("convnext_tiny", num_classes=1000).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    while step < a.steps:
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            with torch.autocast("cuda", torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= a.steps:
                break
