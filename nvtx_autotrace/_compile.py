"""Is TorchDynamo tracing right now?

Every hook and wrapper asks this first. Dynamo inlines our Python wrappers while
it traces a ``torch.compile``'d function; it evaluates this check to True and so
never reaches the NVTX call, which would otherwise break the graph.
"""

from __future__ import annotations

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # torch < 2.3
    try:
        from torch._dynamo import is_compiling as _is_compiling
    except ImportError:  # pragma: no cover - torch without dynamo
        def _is_compiling() -> bool:
            return False

compiling = _is_compiling
