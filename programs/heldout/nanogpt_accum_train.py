"""A nanoGPT-shaped trainer, held out from every rule the analyzer was tuned on.

Its own GPT (pre-LN blocks, fused qkv, SDPA, tied embeddings), bf16 autocast, AdamW (PyTorch's default
foreach), gradient accumulation (--accum micro-batches a step), a cosine learning rate with warm-up,
clip_grad_norm_ every step, random token windows cut on the CPU from one uint16 array and copied
pinned/non-blocking, a loss.item() log every --log-every steps and a short evaluation every --eval-every
steps: the kernel sequence repeats only once per step, with irregular extras.

    python programs/heldout/nanogpt_accum_train.py --steps 120
    python programs/heldout/nanogpt_accum_train.py --device cpu --tiny --steps 6     # smoke test
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
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
    def __init__(self, vocab, ctx, dim, layers, heads):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--compile", action="store_true", help="model = torch.compile(model)")
    a = p.parse_args()
    if a.tiny:
        a.layers, a.dim, a.heads, a.ctx, a.vocab, a.batch = 2, 64, 4, 64, 512, 2
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    data = np.random.default_rng(0).integers(0, a.vocab, 2_000_000, dtype=np.uint16)
    model = GPT(a.vocab, a.ctx, a.dim, a.layers, a.heads).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if a.compile:
        model = torch.compile(model)
    dtype = torch.bfloat16 if cuda else torch.float32

    def batch():
        ix = np.random.randint(0, len(data) - a.ctx - 1, a.batch)
        x = torch.from_numpy(np.stack([data[i:i + a.ctx] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1:i + 1 + a.ctx] for i in ix]).astype(np.int64))
        if cuda:
            return x.pin_memory().to(dev, non_blocking=True), y.pin_memory().to(dev, non_blocking=True)
        return x, y

    def lr_at(it, warm=10):
        if it < warm:
            return 6e-4 * (it + 1) / warm
        return 6e-5 + 0.5 * (6e-4 - 6e-5) * (1 + math.cos(math.pi * min(1.0, (it - warm) / max(1, a.steps))))

    times = []
    for it in range(a.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(it)
        for _micro in range(a.accum):
            x, y = batch()
            with torch.autocast(dev.type, dtype=dtype, enabled=cuda):
                loss = model(x, y) / a.accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it % a.log_every == 0:
            print(f"step {it} loss {loss.item() * a.accum:.4f}", flush=True)
        if a.eval_every and it % a.eval_every == a.eval_every - 1:
            model.eval()
            with torch.no_grad(), torch.autocast(dev.type, dtype=dtype, enabled=cuda):
                ev = sum(model(*batch()).item() for _ in range(2)) / 2
            model.train()
            print(f"eval {it} {ev:.4f}", flush=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = sorted(times[len(times) // 3:])
    print(json.dumps({"median_step_ms": round(1e3 * steady[len(steady) // 2], 2), "steps": a.steps}))


if __name__ == "__main__":
    main()
