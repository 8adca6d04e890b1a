"""A GPT-2-class trainer for the memory question: a planted leak, an out-of-memory step, and gradient accumulation.

    python programs/memory/memory_train.py --steps 60                      # plain, bf16 autocast
    python programs/memory/memory_train.py --leak --steps 60               # a logged loss summed without .item()
    python programs/memory/memory_train.py --oom-at 8 --memory-fraction 0.15   # the batch grows 16x at step 8
    python programs/memory/memory_train.py --micro-batch 8 --accum 4       # effective batch 32

Each step prints one JSON line with what the program itself reads: ``torch.cuda.memory_allocated()`` at the
step's start and ``torch.cuda.max_memory_allocated()`` (since the start: nvtx_autotrace's per-step peak resets
must not show here), and the step's time by CUDA events.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50304, ctx=1024, dim=768, layers=12, heads=12):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=1, help="gradient-accumulation steps per optimizer step")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--leak", action="store_true",
                   help="log a held-out loss summed without .item() or no_grad: each step's graph stays alive")
    p.add_argument("--oom-at", type=int, default=None, help="the micro-batch grows 16x at this step")
    p.add_argument("--memory-fraction", type=float, default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    dev = "cuda"
    if args.memory_fraction:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    model = GPT(layers=args.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    run = torch.compile(model) if args.compile else model
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    data = torch.randint(0, 50257, (64, args.seq + 1), generator=g)
    logged = torch.zeros((), device=dev)
    held = data[:1, :257].to(dev)
    for step in range(args.steps):
        start_alloc = torch.cuda.memory_allocated()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        mb = args.micro_batch * (16 if args.oom_at is not None and step >= args.oom_at else 1)
        for _ in range(args.accum):
            rows = torch.randint(0, 64, (mb,), generator=g)
            batch = data[rows].pin_memory().to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = run(batch[:, :-1], batch[:, 1:]) / args.accum
            loss.backward()
        if args.leak:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logged = logged + run(held[:, :-1], held[:, 1:])  # the planted leak: each step's graph stays alive
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1.record()
        t1.synchronize()
        print(json.dumps({"step": step, "ms": round(t0.elapsed_time(t1), 3), "allocated": start_alloc,
                          "max_allocated": torch.cuda.max_memory_allocated(), "loss": round(loss.item(), 4),
                          "time": round(time.time(), 3)}), flush=True)


if __name__ == "__main__":
    main()
