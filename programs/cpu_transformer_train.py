"""A launch-bound small transformer trained on the CPU: many tiny ops, so per-op overhead dominates.

4 layers, d_model 64, 4 heads, sequence 32, batch 8, AdamW; the loss is
printed every step (a host sync, as most loops do). Deterministic.

    python programs/cpu_transformer_train.py --steps 60

Prints one ``BENCH`` line: the median step time after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 64, layers: int = 4, heads: int = 4, ctx: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    times, cpu, losses = [], [], []
    t0, c0 = time.perf_counter(), time.thread_time()
    for _it in range(args.warmup + args.steps):
        idx = torch.randint(0, 512, (8, 33), generator=gen)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        t1, c1 = time.perf_counter(), time.thread_time()
        times.append((t1 - t0) * 1e3)
        cpu.append((c1 - c0) * 1e3)  # the training thread's own CPU time: what other VMs' load does not change
        t0, c0 = t1, c1
    med = statistics.median(times[args.warmup:])
    cpu_med = statistics.median(cpu[args.warmup:])
    print(f"BENCH program=cpu_transformer step_ms={med:.3f} thread_cpu_ms={cpu_med:.3f} steps={args.steps} "
          f"final_loss={losses[-1]!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
