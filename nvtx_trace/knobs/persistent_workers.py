"""Workers kept between epochs: no restart (and no dataset copy per worker) at every epoch's start."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "persistent_workers", bool, "DataLoader(persistent_workers=True): workers live across epochs",
    applied="dataloader", area="loader", order=30, needs_workers=True, loss_bound=0.0, fixes=("dataloader_stall",),
    pytorch=template("DataLoader(..., persistent_workers={b}){at}"),
    frameworks={"hf_trainer": "TrainingArguments(..., dataloader_persistent_workers={b})"},
    option_words=("persistent-workers", "persistent_workers", "dataloader_persistent_workers"))
