"""A GPT-2-small-class trainer, written the way public ones are (nanoGPT-style).

12 layers, d_model 768, 12 heads, context 1024, bf16 autocast, AdamW, gradient
accumulation, batches sampled from a token array into pinned memory and copied
with non_blocking, ``loss.item()`` logged every step. Random tokens: no data set.

    python programs/gpt2_train.py --steps 30 [--compile] [--layers 12]

Prints one ``BENCH`` line: the median step time after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads, self.dropout = heads, dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, d: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, dropout)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, ctx: int, layers: int, d: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(d, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    torch.manual_seed(1337)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(args.vocab, args.ctx, args.layers, args.d_model, args.heads).to(device)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.randint(0, args.vocab, (2_000_000,), dtype=torch.int64)
    amp = torch.autocast(device.type, dtype=torch.bfloat16)

    def get_batch():
        ix = torch.randint(len(data) - args.ctx - 1, (args.batch_size,))
        x = torch.stack([data[i:i + args.ctx] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + args.ctx] for i in ix])
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    times = []
    x, y = get_batch()
    t0 = time.perf_counter()
    for it in range(args.warmup + args.steps):
        for _micro in range(args.accum):
            with amp:
                _logits, loss = model(x, y)
                loss = loss / args.accum
            x, y = get_batch()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lossf = loss.item() * args.accum  # logged every step, as nanoGPT does: a host sync
        t1 = time.perf_counter()
        times.append((t1 - t0) * 1e3)
        t0 = t1
        if it % 10 == 0:
            print(f"iter {it}: loss {lossf:.4f}, {times[-1]:.1f} ms", flush=True)
    med = statistics.median(times[args.warmup:])
    print("STEPS " + " ".join(f"{t:.1f}" for t in times), flush=True)
    print(f"BENCH program=gpt2 step_ms={med:.3f} steps={args.steps} final_loss={lossf:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
