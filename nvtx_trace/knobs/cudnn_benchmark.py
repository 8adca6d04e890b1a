"""cuDNN picks the fastest convolution algorithm for each shape, once."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "cudnn_benchmark", bool, "torch.backends.cudnn.benchmark = True", applied="backend", area="math", order=60,
    backend=("backends.cudnn.benchmark",), loss_bound=0.01, fixes=("cudnn_benchmark",),
    pytorch=template("torch.backends.cudnn.benchmark = True"),
    frameworks={"lightning": "Trainer(..., benchmark=True)"},
    option_words=("cudnn-benchmark", "cudnn_benchmark", "trainer.benchmark"))
