"""Hugging Face GPT2LMHeadModel (6 layers) in an HF-Trainer-style loop, for "busy GPU" evidence.

What the loop does is what transformers.Trainer does for a plain single-GPU run:
DataLoader over an in-memory token tensor (num_workers=0, pin_memory=True), batches
moved with .to(device), loss from model(input_ids, labels=input_ids), AdamW with no
decay on biases/LayerNorm (fused, Trainer's recent default "adamw_torch_fused";
--optim adamw for foreach), linear schedule with warm-up, clip_grad_norm_(1.0),
loss accumulated on the GPU and .item() logged every --logging-steps steps. Model
config: GPT2Config defaults (dropout 0.1, vocab 50257, n_positions 1024) but n_layer=6;
attention is transformers' default implementation (printed as attn_implementation).

    python programs/busy/hf_style_train.py --dtype fp32 [--tf32] [--compile]

--dtype bf16 wraps forward+loss in torch.autocast('cuda', dtype=torch.bfloat16)
(what Trainer(bf16=True) does); --dtype fp32 keeps PyTorch's defaults
(matmul.allow_tf32 False, cudnn.allow_tf32 True) unless --tf32 sets both True.
--compile: model = torch.compile(model) (Trainer(torch_compile=True)).

Timing and --profile-steps: as in gpt_train.py (CUDA events around each step, one
synchronize at the end; the logging .item() is the program's own sync).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from timing import add_common_args, device_of, timed_loop


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--optim", choices=["adamw_fused", "adamw"], default="adamw_fused")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary size (GPT-2's 50257; 50304 pads it to 64)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="smoke test: 2 layers, d 64")
    add_common_args(p)
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_DISABLED", "true")
    from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup

    dev, cuda = device_of(args)
    torch.manual_seed(0)
    extra = dict(n_embd=64, n_head=4) if args.tiny else {}
    cfg = GPT2Config(n_layer=2 if args.tiny else args.layers, n_positions=args.seq, vocab_size=args.vocab, **extra)
    model = GPT2LMHeadModel(cfg).to(dev)
    model.train()

    decay = [p_ for n, p_ in model.named_parameters() if p_.ndim >= 2]
    no_decay = [p_ for n, p_ in model.named_parameters() if p_.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    fused = args.optim == "adamw_fused" and cuda
    opt = torch.optim.AdamW(groups, lr=5e-5, betas=(0.9, 0.999), eps=1e-8, fused=fused)
    total = args.warmup + max(args.steps, args.profile_steps)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=min(10, total // 10), num_training_steps=total)
    if args.compile:
        model = torch.compile(model)

    n_seq = 256
    tokens = torch.randint(0, cfg.vocab_size, (n_seq, args.seq))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=args.batch,
                                         shuffle=True, drop_last=True, num_workers=0, pin_memory=cuda)
    state = {"it": iter(loader), "tr_loss": torch.zeros((), device=dev), "logged": []}
    amp = args.dtype == "bf16"

    def next_batch():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    def step(i):
        (ids,) = next_batch()
        ids = ids.to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=ids, labels=ids)
        loss = out.loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state["tr_loss"] += loss.detach()
        if (i + 1) % args.logging_steps == 0:
            state["logged"].append(state["tr_loss"].item() / args.logging_steps)  # host sync, as Trainer logs
            state["tr_loss"].zero_()
        return loss

    res = timed_loop(step, args, cuda)
    res.update(program="hf_style_train", **vars(args),
               attn_implementation=getattr(cfg, "_attn_implementation", None),
               matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
               cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
               tokens_per_s=args.batch * args.seq / (res["median_step_ms"] / 1000))
    import transformers
    res["transformers"] = transformers.__version__
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
