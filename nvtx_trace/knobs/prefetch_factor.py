"""Batches each worker keeps ready: uneven batches absorbed by the queue."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "prefetch_factor", int, "DataLoader(prefetch_factor=N): batches each worker loads ahead", applied="dataloader",
    area="loader", order=40, needs_workers=True, loss_bound=0.0, fixes=("dataloader_stall",),
    pytorch=template("DataLoader(..., prefetch_factor={v}){at}"),
    frameworks={"hf_trainer": "TrainingArguments(..., dataloader_prefetch_factor={v})"},
    option_words=("prefetch-factor", "prefetch_factor", "dataloader_prefetch_factor"), option_takes_value=True)
