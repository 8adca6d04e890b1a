"""Analyze one Nsight Systems export: the entry point of the library and of notebooks.

    from nvtx_trace.analyzer import analyze
    result = analyze("report.sqlite", min_gap_ms=1)
    result.findings                     # ranked, biggest measured cost first
    result.tables["gaps"]               # the DataFrames behind every number

Importing this package costs nothing: pandas and the questions load with the first ``analyze``
(``nvtx-trace run`` checks its options through ``analyzer.options`` before it profiles).
"""

from __future__ import annotations

__all__ = ["Analysis", "analyze"]


def __getattr__(name: str):
    if name in __all__:
        from nvtx_trace.analyzer import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
