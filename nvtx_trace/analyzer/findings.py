"""Findings: what to change, what it costs now, and the evidence; every threshold by name.

A finding exists only when there is something to fix: each question's rule has a
threshold under which it stays silent. ``impact_ns`` is measured time (GPU
idle, or GPU/CPU time spent), never an estimate of speed-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from nvtx_trace.analyzer.measures.collectives import ALONE_PREFIX

COMMON_THRESHOLDS = {  # shared by every finding; each question declares its own (questions.thresholds())
    "cause_fraction": 0.05,  # a cause gets its own finding at 5 % of the window
    "min_impact_ns": 1_000_000,  # nothing under 1 ms total is worth a finding
}


class _Thresholds(Mapping):
    """Every threshold by name: the common ones and each registered question's, read on first use from the
    registry, which plugs its ``thresholds()`` in (``use``) (the registry imports findings, never the reverse)."""

    def __init__(self):
        self._all: dict | None = None
        self._source = dict  # the registry's thresholds(), plugged in when the registry is built

    def use(self, source) -> None:
        """Read the questions' thresholds from ``source`` (the registry's), forgetting any read before it."""
        self._source, self._all = source, None

    def _load(self) -> dict:
        if self._all is None:
            self._all = {**COMMON_THRESHOLDS, **self._source()}
        return self._all

    def __getitem__(self, key):
        return self._load()[key]

    def __iter__(self):
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


THRESHOLDS: Mapping = _Thresholds()


@dataclass
class Finding:
    kind: str  # gpu_idle, dataloader_stall, layout_transpose, pageable_h2d, sync, cpu_overhead, cuda_api
    title: str
    impact_ns: int
    fix: str
    evidence: dict = field(default_factory=dict)
    threshold: str = ""
    recommend: dict | None = None  # the fix as settings, e.g. {"num_workers": 11, "pin_memory": True}
    predicted: dict | None = None  # {step_ns, saving_ns, basis}: the steady step after the fix, from measured parts

    def to_dict(self) -> dict:
        return {"kind": self.kind, "title": self.title, "impact_ns": int(self.impact_ns), "fix": self.fix,
                "threshold": self.threshold, "evidence": _plain(self.evidence),
                "recommend": _plain(self.recommend) if self.recommend else None,
                "predicted": _plain(self.predicted) if self.predicted else None}


def _plain(obj):
    """Make evidence JSON-safe (numpy scalars, DataFrames as records)."""
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):
        return [_plain(r) for r in obj.to_dict(orient="records")]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def no_findings_line(warnings: list[str]) -> str:
    """"Nothing to fix", unless the report is one rank's whose busy time may be waiting for the others."""
    if any(w.startswith(ALONE_PREFIX) for w in warnings):
        return ("No findings above the thresholds in this one rank's report, but its time in collectives may be "
                f"waiting for other ranks (see the warning \"{ALONE_PREFIX} ...\").")
    return "No findings above the thresholds: nothing obvious to fix."
