"""The JSON summary as a file: the analysis's summary (analyzer/summary.py, docs/json-schema.md), written."""

from __future__ import annotations

import json

from nvtx_trace.analyzer.summary import to_dict


def render(analysis) -> str:
    return json.dumps(to_dict(analysis), indent=2, allow_nan=False) + "\n"
