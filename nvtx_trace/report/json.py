"""The JSON summary as a file: the analysis's summary (analyzer/summary.py, docs/json-schema.md), written."""

from __future__ import annotations

import json

from nvtx_trace.analyzer.summary import SCHEMA_VERSION, to_dict  # noqa: F401 - SCHEMA_VERSION: until try_runs reads it from summary


def render(analysis) -> str:
    return json.dumps(to_dict(analysis), indent=2, allow_nan=False) + "\n"
