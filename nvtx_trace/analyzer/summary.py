"""The JSON summary: a documented, versioned contract (see docs/json-schema.md), built once here so that every
renderer (the JSON file, the HTML page, diff, history) reads the same figures and none computes its own.

Keys listed there never change meaning within a schema_version; new keys may appear. No environment variables or
host details are ever written here.
"""

from __future__ import annotations

import math

from nvtx_trace import __version__
from nvtx_trace.analyzer.findings import _plain
from nvtx_trace.analyzer.questions import REGISTRY, json_key_order

SCHEMA_VERSION = 1


def to_dict(analysis) -> dict:
    out = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nvtx-trace", "version": __version__},
        "report": {"path": str(analysis.path), "nsys_version": analysis.nsys_version,
                   "schema_version": analysis.schema_version},
    }
    for q in REGISTRY:  # each question writes its own keys (docs/json-schema.md)
        if q.to_json is not None:
            out.update(q.to_json(analysis))
    out["skipped"] = dict(analysis.skipped)
    out["warnings"] = list(analysis.warnings)
    order = json_key_order()
    out = {k: out[k] for k in order if k in out}
    return _finite(_plain(out))


def _finite(obj):
    """JSON has no NaN/Infinity: write null instead."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
