"""Held-out (issue 41, item 8): an image-folder classifier as the torchvision tutorials write it: real JPEG files
decoded by PIL, RandomResizedCrop + flip + normalize in 3 DataLoader workers, a torchvision ResNet-34, fp32, SGD.
The folder (2,000 JPEGs of 320x320 in 10 classes) is made on first use."""
import argparse
import os

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision import transforms as T


def make_folder(root, n=2000, classes=10):
    if os.path.isdir(root) and len(os.listdir(root)) == classes:
        return
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(f"{root}/c{c}", exist_ok=True)
    for i in range(n):
        base = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((320, 320), Image.BICUBIC)
        img.save(f"{root}/c{i % classes}/{i}.jpg", quality=90)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--root", default="/tmp/jpeg_folder")
    a = p.parse_args()
    make_folder(a.root)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    data = torchvision.datasets.ImageFolder(a.root, tf)
    loader = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, num_workers=a.workers, drop_last=True)
    model = torchvision.models.resnet34(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    step = 0
    while step < a.steps:
        for x, y in loader:
            x, y = x.cuda(), y.cuda()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step >= a.steps:
                break
