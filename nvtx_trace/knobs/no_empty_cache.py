"""torch.cuda.empty_cache() skipped: the caching allocator keeps its blocks instead of cudaFree/cudaMalloc."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "no_empty_cache", bool, "torch.cuda.empty_cache() does nothing", applied="call", area="host", order=130, loss_bound=0.0,
    fixes=("allocator",), pytorch=template("# remove torch.cuda.empty_cache() from the training loop"))
