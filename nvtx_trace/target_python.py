"""What the Python that will run the user's program has: nvtx, nvtx_autotrace, a CUDA build of torch.

Asked without importing torch (seconds, gigabytes of libraries): ``run`` must start at once.
"""

from __future__ import annotations

import os
import subprocess
import sys


def torch_has_cuda(spec) -> bool:
    """Whether an installed torch is a CUDA build, without importing it (CPU wheels lack libtorch_cuda)."""
    import glob

    if spec is None or not spec.submodule_search_locations:
        return False
    return bool(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_cuda*")))


def python_probe(python: str) -> dict:
    """nvtx version and whether nvtx_autotrace is importable, as ``python`` sees them (no torch import)."""
    code = ("import importlib.metadata as m, importlib.util as u, json, glob, os\n"
            "try:\n v = m.version('nvtx')\nexcept Exception:\n v = None\n"
            "t = u.find_spec('torch')\n"
            "c = bool(t and t.submodule_search_locations and glob.glob(os.path.join("
            "list(t.submodule_search_locations)[0], 'lib', 'libtorch_cuda*')))\n"
            "print(json.dumps({'nvtx': v, 'autotrace': u.find_spec('nvtx_autotrace') is not None, 'torch_cuda': c}))")
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import importlib.metadata as md
        import importlib.util

        try:
            version = md.version("nvtx")
        except md.PackageNotFoundError:
            version = None
        return {"nvtx": version, "autotrace": importlib.util.find_spec("nvtx_autotrace") is not None,
                "torch_cuda": torch_has_cuda(importlib.util.find_spec("torch"))}
    import json

    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"error": f"{python} does not run"}
