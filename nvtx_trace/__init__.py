"""nvtx-trace: why does the GPU sit idle during training?

The analyzer reads Nsight Systems exports and needs neither torch nor a GPU.
Notebook use::

    from nvtx_trace import analyze
    result = analyze("report.sqlite")
    result.findings            # ranked list of Finding
    result.tables["gaps"]      # pandas DataFrames behind every number
"""

__version__ = "0.1.0"


def analyze(path, **options):
    """Load a report (.sqlite, .nsys-rep, .qdrep) and run every analysis its data allows."""
    from nvtx_trace.analyzer import analyze as _analyze

    return _analyze(path, **options)


__all__ = ["analyze", "__version__"]
