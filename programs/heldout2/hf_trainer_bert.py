"""Held-out (issue 41, item 8): a Hugging Face Trainer script with TrainingArguments' defaults (fp32, no TF32,
dataloader_num_workers=0): a 6-layer BERT for sequence classification built from its config (no download) on
token ids made in the Dataset."""
import argparse

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(1000, 30000, (256,), generator=g), "labels": i % 4}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args()
    cfg = BertConfig(num_hidden_layers=6, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
                     num_labels=4)
    args = TrainingArguments(output_dir="/tmp/hf_bert_out", per_device_train_batch_size=32, max_steps=a.steps,
                             logging_steps=50, save_strategy="no", report_to=[], disable_tqdm=True)
    Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=Tokens()).train()
