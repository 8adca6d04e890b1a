"""Where a finding's facts about the program come from: nvtx_autotrace's settings record, or kernel names. Shared
by the questions that state such facts (a question imports no other question)."""

from __future__ import annotations

RECORDED = "recorded by nvtx_autotrace"
INFERRED = "inferred from kernel names (the report carries no settings record)"


def facts(analysis) -> str:
    """Where a finding's facts about the program come from, for its evidence."""
    return RECORDED if analysis.settings else INFERRED
