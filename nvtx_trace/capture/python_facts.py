"""What a Python has for ``nvtx-trace run``: nvtx, nvtx_autotrace, torch and whether it is a CUDA build.

Standard library only: ``target_python.probe`` runs this file's text with the interpreter that
will run the user's program (which may not have nvtx-trace), and reads the one JSON line it
prints. torch is imported only with ``--import-torch`` (doctor: CUDA availability, GPU count);
without it the answer comes in a fraction of a second, so ``run`` can ask before every start.
"""

import glob
import importlib.metadata as md
import importlib.util
import json
import os
import sys


def torch_has_cuda(spec) -> bool:
    """Whether an installed torch is a CUDA build, without importing it (CPU wheels lack libtorch_cuda)."""
    if spec is None or not spec.submodule_search_locations:
        return False
    return bool(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_cuda*")))


def facts(import_torch: bool = False) -> dict:
    info = {"python": sys.version.split()[0]}
    for package in ("nvtx", "torch"):
        try:
            info[package] = md.version(package)
        except md.PackageNotFoundError:
            info[package] = None
    info["autotrace"] = importlib.util.find_spec("nvtx_autotrace") is not None
    info["torch_cuda"] = torch_has_cuda(importlib.util.find_spec("torch"))
    if import_torch and info["torch"]:
        try:
            import torch

            info["torch"] = torch.__version__  # carries the build, e.g. 2.11.0+cu130
            info["cuda"] = bool(torch.cuda.is_available())
            info["cuda_version"] = torch.version.cuda
            info["gpus"] = torch.cuda.device_count() if info["cuda"] else 0
        except Exception as exc:
            info["torch_error"] = f"{type(exc).__name__}: {exc}"
    return info


if __name__ == "__main__":
    print(json.dumps(facts("--import-torch" in sys.argv[1:])))
