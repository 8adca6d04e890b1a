"""What span of time does the report cover, and which gaps count as idle?"""

from __future__ import annotations

from nvtx_trace.analyzer.question import Question

QUESTION = Question(
    name="trace_span", order=0,
    json_keys=("min_gap_ns", "trace"), json_at=20,
    to_json=lambda analysis: {"min_gap_ns": int(analysis.min_gap_ns),
                              "trace": {"start_ns": int(analysis.trace_start_ns), "end_ns": int(analysis.trace_end_ns)}},
)
