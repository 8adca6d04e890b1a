"""What the Python that will run the user's program has: nvtx, nvtx_autotrace, a CUDA build of torch.

Asked without importing torch (seconds, gigabytes of libraries): ``run`` must start at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys


def torch_has_cuda(spec) -> bool:
    """Whether an installed torch is a CUDA build, without importing it (CPU wheels lack libtorch_cuda)."""
    import glob

    if spec is None or not spec.submodule_search_locations:
        return False
    return bool(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_cuda*")))


def torch_versions(spec) -> tuple[str | None, str | None]:
    """(torch version, CUDA version it was built for) from torch/version.py, read as text: no import."""
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as fh:
            text = fh.read()
    except OSError:
        return None, None

    def value(name: str) -> str | None:
        match = re.search(rf"^{name}\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return match.group(1) if match else None

    return value("__version__"), value("cuda")


def python_probe(python: str) -> dict:
    """nvtx version, whether nvtx_autotrace is importable, torch's and its CUDA's versions, as ``python``
    sees them (no torch import)."""
    code = ("import importlib.metadata as m, importlib.util as u, json, glob, os\n"
            "try:\n v = m.version('nvtx')\nexcept Exception:\n v = None\n"
            "t = u.find_spec('torch')\n"
            "c = bool(t and t.submodule_search_locations and glob.glob(os.path.join("
            "list(t.submodule_search_locations)[0], 'lib', 'libtorch_cuda*')))\n"
            "tv = cv = None\n"
            "try:\n s = open(os.path.join(list(t.submodule_search_locations)[0], 'version.py')).read()\n"
            " import re\n"
            " f = lambda n: (re.search(n + r'\\b[^=\\n]*=\\s*[\\'\"]([^\\'\"]+)', s, re.M) or [None, None])[1]\n"
            " tv, cv = f('^__version__'), f('^cuda')\n"
            "except Exception:\n pass\n"
            "print(json.dumps({'nvtx': v, 'autotrace': u.find_spec('nvtx_autotrace') is not None, 'torch_cuda': c, "
            "'torch': tv, 'cuda': cv}))")
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import importlib.metadata as md
        import importlib.util

        try:
            version = md.version("nvtx")
        except md.PackageNotFoundError:
            version = None
        torch_spec = importlib.util.find_spec("torch")
        torch_version, cuda_version = torch_versions(torch_spec)
        return {"nvtx": version, "autotrace": importlib.util.find_spec("nvtx_autotrace") is not None,
                "torch_cuda": torch_has_cuda(torch_spec), "torch": torch_version, "cuda": cuda_version}
    import json

    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"error": f"{python} does not run"}
