"""How a cause or a setting is named for a person: one wording for the analysis's findings, the pages and the
terminal, so that a renderer names what it draws without reaching into the analysis's measures."""

from __future__ import annotations

# Why the GPU sat idle, in the order the causes claim gap time (the analysis's cause keys, and their words).
IDLE_CAUSES = {
    "dataloader": "waiting for the next batch",
    "sync": "host sync drained the GPU queue",
    "copy": "host-side memory copy",
    "cuda_api": "slow CUDA API call",
    "optimizer": "CPU busy in the optimizer",
    "backward": "CPU busy in backward",
    "forward": "CPU busy in forward",
    "other_range": "CPU busy in another NVTX range",
    "unattributed": "CPU work outside any NVTX range",
}


def depth_text(settings: dict) -> str:
    """How deep nvtx_autotrace's module ranges went, in words ("" when its settings record does not say)."""
    fwd, bwd = settings.get("forward_depth"), settings.get("backward_depth")
    if fwd is None:
        return ""
    if fwd == -1:
        return "no module ranges"
    return f"module ranges to depth {fwd}, backward ranges " + ("none" if bwd == -1 else f"to depth {bwd}")
