"""Host-to-device copies planted at known lines (issue 43, item 4): the pageable-copy finding must name each line.

Line markers: PAGEABLE: a pageable batch copied with .to("cuda") every step; PAGEABLE_NB: a pageable label copied
with .cuda(non_blocking=True) (non_blocking does nothing from pageable memory); PINNED: a pinned batch, the fix.
"""
import argparse

import torch
from torch import nn

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(8192, 1024)
    labels = torch.randint(0, 10, (8192,))
    pinned = torch.randn(2048, 1024).pin_memory()
    for step in range(a.steps):
        x = batch.to("cuda")  # PAGEABLE
        y = labels.cuda(non_blocking=True)  # PAGEABLE_NB
        extra = pinned.to("cuda", non_blocking=True)  # PINNED
        loss = nn.functional.cross_entropy(model(x), y) + 0.0 * extra.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
