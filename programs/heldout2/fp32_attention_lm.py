"""Held-out (issue 41, item 8): a decoder-only language model written by hand in fp32 (no autocast, no TF32),
attention as softmax(QK^T/sqrt(d))V with an explicit causal mask, AdamW; batches made on the GPU."""
import argparse
import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h, self.ln1, self.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
        mask = torch.triu(torch.ones(t, t, device=x.device, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self, vocab=16384, d=512, h=8, layers=8, t=512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(1, t, d))
        self.blocks = nn.Sequential(*[Block(d, h) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos[:, :idx.shape[1]])))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args()
    torch.manual_seed(0)
    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(a.steps):
        idx = torch.randint(0, 16384, (16, 513), device="cuda")
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
