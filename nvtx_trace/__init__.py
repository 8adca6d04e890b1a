"""nvtx-trace: why does the GPU sit idle during training?

The analyzer reads Nsight Systems exports and needs neither torch nor a GPU.
Notebook use::

    from nvtx_trace import analyze
    result = analyze("report.sqlite")
    result.findings            # ranked list of Finding
    result.tables["gaps"]      # pandas DataFrames behind every number
"""

from __future__ import annotations

__version__ = "0.1.0"


def analyze(path, nsys: str | None = None, **options):
    """Load a report (.sqlite, or .nsys-rep/.qdrep exported first with ``nsys``, found if not given) and run every
    analysis its data allows; several reports (a list, a folder, a glob) are merged, one per rank."""
    from nvtx_trace.analyzer import analyze as _analyze
    from nvtx_trace.analyzer.ranks.inputs import expand
    from nvtx_trace.capture.export import as_sqlite

    return _analyze([as_sqlite(p, nsys) for p in expand(path)], **options)


__all__ = ["analyze", "__version__"]
