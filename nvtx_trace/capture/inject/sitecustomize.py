"""Installs nvtx_autotrace in every Python process that imports torch, then runs the sitecustomize
this one hides (if any).

``nvtx-trace run -- COMMAND`` (torchrun, a shell script) puts this folder first on the program's
PYTHONPATH. It is the only file here: the folder shadows no other module.
"""

import os as _os
import sys as _sys


def _nvtx_trace_chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


class _NvtxTraceWatch:
    """Installs nvtx_autotrace right after `import torch` finishes, in processes that use torch only."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        _sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            try:
                import nvtx_autotrace  # noqa: F401  importing installs it
            except Exception as exc:
                print(f"nvtx-trace: nvtx_autotrace not installed in pid {_os.getpid()}: {exc}",
                      file=_sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if "torch" in _sys.modules:
    import nvtx_autotrace  # noqa: F401
else:
    _sys.meta_path.insert(0, _NvtxTraceWatch())
try:
    _nvtx_trace_chain()
finally:
    del _nvtx_trace_chain
