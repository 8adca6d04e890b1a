"""A larger micro-batch with fewer gradient-accumulation steps: the effective batch, and what is trained, unchanged."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "micro_batch", int, "micro-batch N times larger and N times fewer gradient-accumulation steps, through the "
    "program's own two options (--batch-size/--grad-accum, per_device_train_batch_size/gradient_accumulation_steps); "
    "the effective batch is unchanged", applied="option", area="", order=160, minimum=2,
    # the same samples summed in another order (where the program divides each micro-batch's loss by the
    # accumulation steps, the step's loss is the same mean): rounding only, and a sampler that draws differently
    loss_bound=0.02, fixes=("memory_headroom",),
    pytorch=template("micro-batch x{v} and gradient-accumulation steps / {v} (the effective batch unchanged)"),
    frameworks={"hf_trainer": "TrainingArguments(..., per_device_train_batch_size=<x{v}>, "
                              "gradient_accumulation_steps=<÷{v}>)"},
    option_words=("micro_batch", "micro_batch_size", "micro_bs", "batch_size", "per_device_train_batch_size",
                  "train_batch_size", "bs"),
    option_takes_value=True,
    option_with=("accum", "grad_accum", "accum_steps", "grad_accum_steps", "gradient_accumulation_steps",
                 "accumulation_steps", "gradient_accumulation", "accumulate_grad_batches"))
