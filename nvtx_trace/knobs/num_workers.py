"""DataLoader worker processes: batches made in parallel, ahead of the loop."""

from nvtx_trace.knobs.knob import Knob, template


def _workers(summary: dict):
    """Each DataLoader's worker count the report shows (one loader: its count; several: the list)."""
    loaders = (summary.get("dataloader") or {}).get("loaders") or []
    workers = [loader.get("workers") for loader in loaders if loader.get("workers") is not None]
    return workers[0] if len(workers) == 1 else workers or None


KNOB = Knob(
    "num_workers", int, "DataLoader(num_workers=N) for every DataLoader the script builds", applied="dataloader", area="loader",
    order=10, minimum=0,
    # a worker count changes which worker seeds a sample's random augmentation, hence a bound above zero
    loss_bound=0.05, fixes=("dataloader_stall",),
    pytorch=template("DataLoader(..., num_workers={v}){at}"),
    frameworks={"hf_trainer": "TrainingArguments(..., dataloader_num_workers={v})"},
    option_words=("num-workers", "num_workers", "workers", "dataloader_num_workers"), option_takes_value=True,
    observed=_workers)
