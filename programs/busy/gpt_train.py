"""GPT-2-small-class decoder training, plain PyTorch (nanoGPT-shaped), for "busy GPU" evidence.

12 layers, d 768, 12 heads, context 1024, vocab 50304, weight-tied lm_head, AdamW
(foreach, the PyTorch default). Random tokens, already on the GPU (a pool of 16 batches).

    python programs/busy/gpt_train.py --dtype bf16 --attn manual [--compile] [--tf32]

--dtype bf16   torch.autocast('cuda', dtype=torch.bfloat16) around forward + loss
--dtype fp32   no autocast. Matmuls then follow torch.backends.cuda.matmul.allow_tf32,
               whose PyTorch default is False (true fp32), and convolutions follow
               torch.backends.cudnn.allow_tf32, whose default is True. Without --tf32
               both defaults are KEPT (not forced); --tf32 sets both to True.
--attn manual  softmax(mask(Q K^T / sqrt(d))) V written out; --attn sdpa uses
               F.scaled_dot_product_attention(is_causal=True).

Timing: one torch.cuda.Event is recorded before the first timed step and after each
timed step (no synchronize inside the loop); one torch.cuda.synchronize() at the end,
then step i = elapsed_time(ev[i], ev[i+1]). The program itself has no host sync
per step (no .item()). Prints one JSON line at the end.

--profile-steps K: after warm-up, torch.cuda.profiler.start(), K steps each inside
torch.cuda.nvtx.range_push(f"step {i}")/range_pop(), then profiler.stop(); the K
profiled steps are the timed ones (for nsys --capture-range=cudaProfilerApi).
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from timing import add_common_args, device_of, timed_loop


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, ctx, attn):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads, self.attn = heads, attn
        if attn == "manual":
            self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx)).view(1, 1, ctx, ctx), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads, ctx, attn):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, ctx, attn)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, ctx, layers, d, heads, attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, heads, ctx, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--attn", choices=["manual", "sdpa"], default="manual")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--optim", choices=["default", "loop", "foreach", "fused"], default="default",
                   help="AdamW as PyTorch picks (default: foreach on CUDA), foreach=False (loop), or fused=True")
    p.add_argument("--empty-cache", action="store_true", help="torch.cuda.empty_cache() after every step")
    p.add_argument("--anomaly", action="store_true", help="torch.autograd.set_detect_anomaly(True)")
    p.add_argument("--no-set-to-none", action="store_true", help="zero_grad(set_to_none=False)")
    add_common_args(p)
    args = p.parse_args(argv)

    dev, cuda = device_of(args)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.layers, args.dim, args.heads, args.attn).to(dev)
    kind = {"default": {}, "loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, **kind[args.optim])
    if args.anomaly:
        torch.autograd.set_detect_anomaly(True)
    if args.compile:
        model = torch.compile(model)
    pool = torch.randint(0, args.vocab, (16, args.batch, args.seq + 1), device=dev)
    amp = args.dtype == "bf16"

    def step(i):
        xy = pool[i % pool.size(0)]
        x, y = xy[:, :-1], xy[:, 1:]
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not args.no_set_to_none)
        if args.empty_cache:
            torch.cuda.empty_cache()
        return loss

    res = timed_loop(step, args, cuda)
    res.update(program="gpt_train", **vars(args),
               matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
               cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
               tokens_per_s=args.batch * args.seq / (res["median_step_ms"] / 1000))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
