"""A Hugging Face ``Trainer`` run: GPT-2 with 6 layers, bf16, random tokens, no code of ours.

    python programs/hf_trainer_train.py --steps 40

Step times come from a ``TrainerCallback`` (``on_step_end`` after a CUDA sync).
Prints one ``BENCH`` line: the median step time after ``--warmup`` steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ctx", type=int, default=1024)
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_DISABLED", "true")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_positions=args.ctx))
    n = (args.warmup + args.steps) * args.batch_size
    tokens = torch.randint(0, model.config.vocab_size, (n, args.ctx))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": tokens[i], "labels": tokens[i]}

    times: list[float] = []

    class StepTimer(TrainerCallback):
        t0 = None

        def on_step_end(self, *_a, **_k):
            torch.cuda.synchronize()
            t = time.perf_counter()
            if self.t0 is not None:
                times.append((t - self.t0) * 1e3)
            self.t0 = t

    out = tempfile.mkdtemp(prefix="hf-bench-")
    targs = TrainingArguments(output_dir=out, per_device_train_batch_size=args.batch_size, max_steps=args.warmup + args.steps,
                              bf16=True, logging_steps=10, save_strategy="no", report_to=[], dataloader_num_workers=2,
                              learning_rate=5e-4, disable_tqdm=True)
    Trainer(model=model, args=targs, train_dataset=Tokens(), callbacks=[StepTimer()]).train()
    med = statistics.median(times[args.warmup:])
    print(f"BENCH program=hf_trainer step_ms={med:.3f} steps={len(times) - args.warmup}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
