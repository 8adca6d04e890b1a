"""A knob as the framework driving the loop spells it: what a finding's fix and tune's "how to keep them" say to a
Hugging Face Trainer or Lightning user, instead of the plain PyTorch lines their script never holds."""

from __future__ import annotations

NAMES = {"hf_trainer": "Hugging Face Trainer", "lightning": "Lightning"}
OPTIONS = {
    "hf_trainer": {"tf32": "TrainingArguments(..., tf32=True)", "amp": "TrainingArguments(..., bf16=True)",
                   "compile": "TrainingArguments(..., torch_compile=True)",
                   "fused_optimizer": 'TrainingArguments(..., optim="adamw_torch_fused")',
                   "num_workers": "TrainingArguments(..., dataloader_num_workers={v})",
                   "pin_memory": "TrainingArguments(..., dataloader_pin_memory={b})",
                   "persistent_workers": "TrainingArguments(..., dataloader_persistent_workers={b})",
                   "prefetch_factor": "TrainingArguments(..., dataloader_prefetch_factor={v})"},
    "lightning": {"tf32": 'torch.set_float32_matmul_precision("high")  # before trainer.fit',
                  "amp": 'Trainer(..., precision="bf16-mixed")', "cudnn_benchmark": "Trainer(..., benchmark=True)",
                  "compile": "model = torch.compile(model)  # the LightningModule, before trainer.fit(model)"},
}


def framework_of(settings: dict | None) -> str:
    return ((settings or {}).get("framework") or {}).get("name") or "pytorch"


def option(framework: str, knob: str, value) -> str | None:
    """The framework's own spelling of ``knob=value``, or None where it has none (plain PyTorch's applies)."""
    text = OPTIONS.get(framework, {}).get(knob)
    if text is None or (knob == "amp" and value != "bf16"):
        return None
    return text.format(v=value, b=bool(value))


def sentence(settings: dict | None, knobs: dict) -> str:
    """" In Lightning: Trainer(..., precision="bf16-mixed")." for a finding's knobs; "" where nothing applies."""
    framework = framework_of(settings)
    said = [o.split("  #")[0] for k, v in knobs.items() if (o := option(framework, k, v))]  # code, not comments
    return f" In {NAMES[framework]}: {'; '.join(said)}." if said and framework in NAMES else ""
