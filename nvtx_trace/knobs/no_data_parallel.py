"""DataParallel over one GPU calls its module directly: no scatter, gather or thread per step."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "no_data_parallel", bool, "a DataParallel over one GPU calls its module directly", applied="call", area="host", order=140,
    fixes=("data_parallel",),
    pytorch=template("model = model.module  # DataParallel over one GPU adds scatter, gather and a thread"))
