"""zero_grad frees the gradients instead of writing zeros into them."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "set_to_none", bool, "every optimizer.zero_grad() with set_to_none=True", applied="call", area="optimizer", order=120,
    loss_bound=0.0, fixes=("optimizer",), pytorch=template("optimizer.zero_grad(set_to_none=True)"))
