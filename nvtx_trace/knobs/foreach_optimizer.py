"""The optimizer step over lists of tensors (a few kernels per step), where fused is not offered."""

from nvtx_trace.knobs.knob import PLAIN, Knob, template

KNOB = Knob(
    "foreach_optimizer", bool, "foreach=True for every optimizer class that takes it", applied="optimizer", area="optimizer",
    order=80, optimizer_arg="foreach", loss_bound=1e-3, fixes=("optimizer",),
    pytorch=template("optimizer = torch.optim.{optimizer}(model.parameters(), ..., foreach=True)"),
    frameworks={"lightning": ("# in configure_optimizers():", PLAIN)})
