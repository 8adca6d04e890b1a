"""Host syncs planted at known lines (issue 43): the sync finding must name each line with its time per step.

Line markers (the test reads them from this file, not from numbers kept elsewhere):
  LOSS_ITEM: loss.item() every step; ACC_CPU: accuracy .cpu() every step; LOG_SYNC: torch.cuda.synchronize() in
  a logging helper every 4 steps; MASK: boolean-mask indexing (an implicit sync no wrapper sees).
"""
import argparse
import time

import torch
from torch import nn


def log_timing(step, t0):
    torch.cuda.synchronize()  # LOG_SYNC
    return time.perf_counter() - t0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    a = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4096, 512, device="cuda"), torch.randint(0, 10, (4096,), device="cuda")
    seen, t0 = 0.0, time.perf_counter()
    took = []  # each step's wall time: every step ends on a sync, so this is the step the user sees
    for step in range(a.steps):
        began = time.perf_counter()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += loss.item()  # LOSS_ITEM
        acc = (logits.argmax(1) == y).float().mean().cpu()  # ACC_CPU
        hard = x[logits.max(1).values < 0.5]  # MASK
        if step % 4 == 0:
            log_timing(step, t0)
        if step % 50 == 0:
            print(f"step {step} loss {seen / (step + 1):.3f} acc {float(acc):.3f} hard {len(hard)}", flush=True)
        took.append(time.perf_counter() - began)
    steady = sorted(took[len(took) // 4:])
    print(f"median step {steady[len(steady) // 2] * 1e3:.4f} ms over {len(steady)} steps", flush=True)
