"""An ImageNet-example-shaped loop that the host holds back (issue 43, item 5): ResNet-50 in DataParallel on one
GPU, a DataLoader of worker-made images, and, every step, the loss read with .item() and top-1/top-5 accuracy read
on the host, as pytorch/examples' imagenet/main.py and many copies of it do. Small images keep each kernel short,
so launches and syncs, not the GPU, set the pace.

    python programs/hostbound/imagenet_style.py [--no-dp] [--read-every N] [--steps N]

--no-dp and --read-every are the changes by hand the tool's knobs are compared with. Prints each 20th step and,
at the end, the median step of the steady half in ms.
"""
import argparse
import time

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset


class FakeImages(Dataset):
    def __init__(self, n, size):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), int(i % 1000)


def accuracy(output, target, topk=(1, 5)):
    with torch.no_grad():
        _, pred = output.topk(max(topk), 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0) * (100.0 / target.size(0)) for k in topk]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=96)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--no-dp", action="store_true")
    p.add_argument("--read-every", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda()
    if not a.no_dp:
        model = nn.DataParallel(model)
    crit = nn.CrossEntropyLoss().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    loader = DataLoader(FakeImages(a.steps * a.batch, a.size), batch_size=a.batch, shuffle=True,
                        num_workers=a.workers, pin_memory=True, persistent_workers=a.workers > 0)
    took, losses, top1s = [], [], []
    model.train()
    end = time.perf_counter()
    for step, (images, target) in enumerate(loader):
        images = images.cuda(non_blocking=True)
        target = target.cuda(non_blocking=True)
        output = model(images)
        loss = crit(output, target)
        acc1, acc5 = accuracy(output, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % a.read_every == 0:
            losses.append(loss.item())  # the host reads the loss: a sync
            top1s.append(acc1.item())
            top5 = acc5.item()
        now = time.perf_counter()
        took.append(now - end)
        end = now
        if step % 20 == 0:
            print(f"step {step} loss {losses[-1] if losses else float('nan'):.3f}", flush=True)
    torch.cuda.synchronize()
    steady = sorted(took[len(took) // 2:])
    print(f"median step {steady[len(steady) // 2] * 1e3:.3f} ms over {len(steady)} steps", flush=True)
