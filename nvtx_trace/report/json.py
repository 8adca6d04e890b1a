"""The JSON summary: a documented, versioned contract (see docs/json-schema.md).

Keys listed there never change meaning within a schema_version; new keys may
appear. No environment variables or host details are ever written here.
"""

from __future__ import annotations

import json
import math

from nvtx_trace import __version__
from nvtx_trace.analyzer.findings import _plain

SCHEMA_VERSION = 1
KEY_ORDER = ("schema_version", "tool", "report", "clock", "ranks", "min_gap_ns", "trace", "window", "startup", "devices",
             "idle_causes", "steps",
             "dataloader", "transposes", "pageable_h2d", "sync", "communication", "instrumentation", "profiler", "findings",
             "skipped", "warnings")


def to_dict(a) -> dict:
    from nvtx_trace.analyzer.units import UNITS

    out = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nvtx-trace", "version": __version__},
        "report": {"path": str(a.path), "nsys_version": a.nsys_version, "schema_version": a.schema_version},
        "min_gap_ns": int(a.min_gap_ns),
        "trace": {"start_ns": int(a.trace_start_ns), "end_ns": int(a.trace_end_ns)},
    }
    for unit in UNITS:  # each analysis unit writes its own sections (docs/json-schema.md)
        if unit.to_json is not None:
            out.update(unit.to_json(a))
    out["skipped"] = dict(a.skipped)
    out["warnings"] = list(a.warnings)
    first = [k for k in KEY_ORDER if k in out]  # the documented order reads best; new sections follow it
    out = {k: out[k] for k in first + [k for k in out if k not in KEY_ORDER]}
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


def render(a) -> str:
    return json.dumps(to_dict(a), indent=2, allow_nan=False) + "\n"
