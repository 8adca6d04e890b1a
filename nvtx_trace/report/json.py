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


def to_dict(a) -> dict:
    out = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nvtx-trace", "version": __version__},
        "report": {"path": str(a.path), "nsys_version": a.nsys_version, "schema_version": a.schema_version},
        "min_gap_ns": int(a.min_gap_ns),
        "trace": {"start_ns": int(a.trace_start_ns), "end_ns": int(a.trace_end_ns)},
        "window": a.window or None,
        "devices": [],
        "idle_causes": None,
        "steps": None,
        "dataloader": None,
        "transposes": None,
        "pageable_h2d": None,
        "sync": None,
        "instrumentation": a.instrumentation.to_dict() if a.instrumentation else None,
        "profiler": a.instrumentation.profiler_dict() if a.instrumentation else None,
        "findings": [f.to_dict() for f in a.findings],
        "skipped": dict(a.skipped),
        "warnings": list(a.warnings),
    }
    if a.idle:
        out["devices"] = [{
            "device_id": d.device_id, "name": d.name, "pids": d.pids, "span_start_ns": d.span_start_ns,
            "span_end_ns": d.span_end_ns, "span_ns": d.span_ns, "busy_ns": d.busy_ns, "utilization": d.utilization,
            "gap_count": d.gap_count, "gap_idle_ns": d.gap_idle_ns,
            "window_utilization": a.window_utilization.get(d.device_id),
        } for d in a.idle.devices]
        out["idle_causes"] = {"window": a.window_causes, "whole_trace": a.idle.causes}
    if a.steps:
        table = a.steps.table.astype(object)
        for what in ("gpu_busy", "loader_wait", "sync_wait"):
            if what not in a.steps.measured:  # not captured: unknown, not zero
                table[f"{what}_ns"] = None
        out["steps"] = {"source": a.steps.source, "summary": a.steps.summary(), "table": table}
    if a.loader:
        out["dataloader"] = {"loaders": a.loader.loaders, "workers": a.loader.workers,
                             "worker_restarts": a.loader.restarts}
    if a.layout:
        lay = a.layout
        out["transposes"] = {"count": lay.count, "time_ns": lay.time_ns, "kernel_time_ns": lay.kernel_time_ns,
                             "kernel_time_fraction": lay.kernel_time_fraction, "kernels": lay.by_kernel,
                             "modules": lay.by_module}
    if a.pageable:
        p = a.pageable
        out["pageable_h2d"] = {"count": p.count, "bytes": p.bytes, "time_ns": p.time_ns, "api_ns": p.api_ns,
                               "bandwidth_gbps": p.bandwidth_gbps, "pinned_count": p.pinned_count,
                               "pinned_bytes": p.pinned_bytes, "pinned_time_ns": p.pinned_time_ns,
                               "pinned_bandwidth_gbps": p.pinned_bandwidth_gbps, "sources": p.by_source}
    if a.sync:
        out["sync"] = {"count": a.sync.count, "blocked_ns": a.sync.blocked_ns, "sources": a.sync.by_source}
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
