"""Page-locked batches: host-to-device copies at full speed, and asynchronous."""

from nvtx_trace.knobs.knob import Knob, template

KNOB = Knob(
    "pin_memory", bool, "DataLoader(pin_memory=True): batches in page-locked memory", applied="dataloader", area="loader",
    order=20, loss_bound=0.0, fixes=("dataloader_stall", "pageable_h2d"),
    pytorch=template("DataLoader(..., pin_memory={b}){at}"),
    frameworks={"hf_trainer": "TrainingArguments(..., dataloader_pin_memory={b})"},
    option_words=("pin-memory", "pin_memory", "pin_mem", "dataloader_pin_memory"))
