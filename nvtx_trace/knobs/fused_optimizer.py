"""One fused kernel for the whole optimizer step."""

from nvtx_trace.knobs.knob import PLAIN, Knob, template

KNOB = Knob(
    "fused_optimizer", bool, "fused=True for every optimizer class that takes it", applied="optimizer", area="optimizer",
    order=70, optimizer_arg="fused", loss_bound=1e-3, fixes=("optimizer",),
    pytorch=template("optimizer = torch.optim.{optimizer}(model.parameters(), ..., fused=True)"),
    frameworks={"hf_trainer": 'TrainingArguments(..., optim="adamw_torch_fused")',
                "lightning": ("# in configure_optimizers():", PLAIN)},
    option_words=("fused", "fused_optimizer", "fused_adam", "adamw_torch_fused"), option_choosers=("optim",))
