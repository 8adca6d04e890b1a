"""A GPT-2 (124M) trainer whose command line holds its own speed options, shaped like public GPT-2 trainers:
fp32 defaults, and ``--flash``, ``--dtype``, ``--tensorcores``, ``--compile`` to turn on what makes it fast.

    python programs/options/gpt2_flags_train.py                       (fp32, hand-written attention, eager)
    python programs/options/gpt2_flags_train.py --flash 1 --dtype bfloat16 --tensorcores 1 --compile 1

Random tokens already on the GPU; vocabulary 50257 (GPT-2's, not padded); AdamW. Prints one JSON line at the end:
the median step (CUDA events between steps, no sync inside the loop) over the steps after --warmup.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads, ctx, flash):
        super().__init__()
        self.qkv, self.proj, self.heads, self.flash = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, flash
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            att = F.softmax(att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, d, heads, ctx, flash):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(d, heads, ctx, flash), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, d, heads, flash):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, ctx, flash) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--sequence_length", type=int, default=1024)
    p.add_argument("--num_iterations", type=int, default=200)
    p.add_argument("--warmup", type=int, default=30, help="steps left out of the printed median")
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tensorcores", type=int, default=0, help="use tensor cores (TF32) for fp32 matmuls")
    p.add_argument("--dtype", type=str, default="float32", help="float32|bfloat16: the autocast dtype")
    p.add_argument("--flash", type=int, default=0, help="fused (flash) attention")
    p.add_argument("--compile", type=int, default=0, help="torch.compile the model")
    args = p.parse_args(argv)
    if args.tensorcores:
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    model = GPT(50257, args.sequence_length, args.layers, 768, 12, bool(args.flash)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.1)
    if args.compile:
        model = torch.compile(model)
    pool = torch.randint(0, 50257, (8, args.batch_size, args.sequence_length + 1), device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bfloat16")
    events = []
    for step in range(args.num_iterations):
        batch = pool[step % len(pool)]
        with autocast:
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    torch.cuda.synchronize()
    steps = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    print(json.dumps({"program": "gpt2_flags", "args": vars(args), "median_step_ms": statistics.median(steps)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
