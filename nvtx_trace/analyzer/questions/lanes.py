"""Which NVTX ranges, on which threads, does the HTML timeline draw?"""

from __future__ import annotations

import pandas as pd

from nvtx_trace.analyzer.measures.gpu_idle import range_categories
from nvtx_trace.analyzer.question import Context, Question


def _run(ctx: Context) -> None:
    """Kept here so no renderer reads a file."""
    ranges = ctx.trace.ranges
    ctx.result.nvtx_ranges = ranges
    ctx.result.nvtx_threads = {int(g): ctx.trace.thread_label(int(g)) for g in pd.unique(ranges["gtid"])} \
        if len(ranges) else {}
    # each range name's colour, by the loader pattern the user gave (the renderer drew the default's)
    ctx.result.nvtx_categories = range_categories(ranges["name"], ctx.loader_pattern) if len(ranges) else {}


QUESTION = Question(
    name="lanes", order=130, run=_run,
    results={"nvtx_ranges": None, "nvtx_threads": {}, "nvtx_categories": {}},  # every NVTX range; their threads'
    # labels; each range name's colour key
)
