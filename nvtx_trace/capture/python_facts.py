"""What a Python has for ``nvtx-trace run``: nvtx, nvtx_autotrace, torch (its version, whether it is a CUDA
build and for which CUDA).

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
import re
import sys


def torch_has_cuda(spec) -> bool:
    """Whether an installed torch is a CUDA build, without importing it (CPU wheels lack libtorch_cuda)."""
    if spec is None or not spec.submodule_search_locations:
        return False
    return bool(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "lib", "libtorch_cuda*")))


def torch_versions(spec):
    """(torch.__version__, the CUDA it was built for) from torch/version.py, read as text: no import.

    No annotations with ``X | None`` here: this file runs in the target Python, which may predate 3.10.
    """
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as fh:
            text = fh.read()
    except OSError:
        return None, None

    def value(name):
        match = re.search(rf"^{name}\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return match.group(1) if match else None

    return value("__version__"), value("cuda")


def module_found(name):
    """Whether ``python -m name`` would find the module, without importing it or its packages: the current
    folder first, as ``-m`` looks, then the path; finders of installed packages (an editable install) next."""
    import importlib.machinery

    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd()] + sys.path)
    if spec is None:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            spec = None
    for part in parts[1:]:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec is not None


def facts(import_torch: bool = False, module=None) -> dict:
    info = {"python": sys.version.split()[0]}
    if module:
        info["module_found"] = module_found(module)
    for package in ("nvtx", "torch"):
        try:
            info[package] = md.version(package)
        except md.PackageNotFoundError:
            info[package] = None
    info["autotrace"] = importlib.util.find_spec("nvtx_autotrace") is not None
    torch_spec = importlib.util.find_spec("torch")
    info["torch_cuda"] = torch_has_cuda(torch_spec)
    version, info["cuda_version"] = torch_versions(torch_spec)  # cuda_version: None for a CPU build
    info["torch"] = version or info["torch"]  # what torch.__version__ says, else the package's metadata
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
    args = sys.argv[1:]
    print(json.dumps(facts("--import-torch" in args, args[args.index("--module") + 1] if "--module" in args else None)))
