"""The model and its 4-D inputs in channels_last (NHWC): no layout transposes around cuDNN's convolutions."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "channels_last", bool, "the model and its 4-D inputs in channels_last from step 1 on", applied="model", area="math",
    order=110, loss_bound=0.01, numerics=True, fixes=("layout_transpose",),
    pytorch=template("model = model.to(memory_format=torch.channels_last)",
                     "inputs = inputs.to(memory_format=torch.channels_last)  # each batch, in the loop"),
    option_words=("channels-last", "channels_last"))
