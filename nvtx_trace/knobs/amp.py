"""bf16 autocast around the model's forward: matrix math on bf16 tensor cores."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "amp", str, "torch.autocast(dtype=bfloat16) around the model's forward (and a LightningModule's training_step)",
    applied="model", area="math", order=90,
    choices={"bf16": "bf16", "bfloat16": "bf16", "bf16-mixed": "bf16", "fp16": "fp16", "float16": "fp16"},
    loss_bound=0.02, numerics=True, fixes=("precision",),
    refused_by_tune=lambda value: "fp16 needs a GradScaler the program may not have" if value == "fp16" else "",
    pytorch=template('with torch.autocast("cuda", dtype=torch.bfloat16):  # around the forward and the loss, not '
                     "backward()", "    loss = criterion(model(inputs), targets)"),
    frameworks={"hf_trainer": lambda value: "TrainingArguments(..., bf16=True)" if value == "bf16" else None,
                "lightning": lambda value: 'Trainer(..., precision="bf16-mixed")' if value == "bf16" else None},
    option_words=("bf16", "dtype", "amp_dtype", "autocast_dtype", "precision", "mixed_precision",
                  "trainer.precision"),
    option_enables=("amp", "use_amp"), precision=lambda value: "bf16" if value == "bf16" else None)
