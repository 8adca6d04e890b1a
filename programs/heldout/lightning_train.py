"""A LightningModule trained by Lightning's Trainer with its defaults, held out from the analyzer's tuning.

A decoder-only transformer language model (nn.TransformerEncoderLayer blocks with a causal mask, SDPA inside),
random tokens from a DataLoader of 2 workers, AdamW from ``configure_optimizers``, the loss logged with
``self.log(..., prog_bar=True)``; ``Trainer(max_steps=..., devices=1)`` otherwise as it comes: precision
"32-true" (TF32 off for matmuls), a progress bar, a logger, checkpoints. Lightning runs ``training_step``
(forward, loss, backward) inside ``optimizer.step(closure)``.

    python programs/heldout/lightning_train.py --steps 200 [--tf32] [--bf16] [--compile]

--tf32: torch.set_float32_matmul_precision("high"); --bf16: Trainer(precision="bf16-mixed"); --compile:
torch.compile(model) before fit. A callback times the steps after --warmup (one CUDA synchronize at each end of
the timed span) and prints one JSON line: {"mean_step_ms": ..., "steps": ...}.
"""

from __future__ import annotations

import argparse
import json
import time

import lightning as L
import torch
import torch.nn.functional as F


class LM(L.LightningModule):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(1, seq, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, x):
        h = self.emb(x) + self.pos[:, : x.shape[1]]
        return self.head(self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        logits = self(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(L.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.t0, self.n = warmup, None, 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == self.warmup:
            _sync()
            self.t0 = time.perf_counter()
        elif self.t0 is not None:
            self.n += 1

    def on_train_end(self, trainer, module):
        if self.t0 is not None and self.n:
            _sync()
            print(json.dumps({"mean_step_ms": round((time.perf_counter() - self.t0) * 1e3 / self.n, 2),
                              "steps": self.n}), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--tf32", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args(argv)
    L.seed_everything(0)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    tokens = torch.randint(0, args.vocab, (args.batch * (args.steps + 5), args.seq + 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=args.batch,
                                         shuffle=True, num_workers=args.workers)
    model = LM(args.vocab, args.dim, args.layers, 12, args.seq)
    if args.compile:
        model = torch.compile(model)
    trainer = L.Trainer(max_steps=args.steps, devices=1, precision="bf16-mixed" if args.bf16 else "32-true",
                        callbacks=[StepTimer(args.warmup)])
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
