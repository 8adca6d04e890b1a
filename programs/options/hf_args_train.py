"""A Hugging Face ``Trainer`` script whose settings come from its command line, as the examples' run_clm.py takes
them: ``HfArgumentParser`` over ``TrainingArguments`` (and a dataclass of its own), so ``--bf16``, ``--tf32 True``,
``--torch_compile``, ``--dataloader_num_workers N`` are its own options. GPT-2 (6 layers), random tokens, fp32 by
default (TrainingArguments' defaults).

    python programs/options/hf_args_train.py --output_dir /tmp/hf --max_steps 300
    python programs/options/hf_args_train.py --output_dir /tmp/hf --max_steps 300 --bf16 --tf32 True --torch_compile

Prints one JSON line at the end: the median step (a callback, CUDA-synchronized at each step's end) after 30 steps.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field

import torch


@dataclass
class ModelArguments:
    layers: int = field(default=6, metadata={"help": "transformer blocks"})
    context: int = field(default=1024, metadata={"help": "tokens per sample"})


def main() -> int:
    os.environ.setdefault("WANDB_DISABLED", "true")
    from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

    model_args, args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=model_args.layers, n_positions=model_args.context))
    count = (args.max_steps + 5) * args.per_device_train_batch_size
    tokens = torch.randint(0, model.config.vocab_size, (count, model_args.context))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return count

        def __getitem__(self, i):
            return {"input_ids": tokens[i], "labels": tokens[i]}

    times: list[float] = []

    class StepTimer(TrainerCallback):
        last = None

        def on_step_end(self, *_a, **_k):
            torch.cuda.synchronize()
            now = time.perf_counter()
            if self.last is not None:
                times.append((now - self.last) * 1e3)
            self.last = now

    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[StepTimer()]).train()
    print(json.dumps({"program": "hf_args", "median_step_ms": statistics.median(times[30:] or times)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
