"""The one probe of the Python that will run the user's program, for ``run`` and ``doctor``.

Asked in a child interpreter (that Python may differ from ours, and importing torch here would
cost seconds and gigabytes): ``run`` asks without importing torch, ``doctor`` with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nvtx_trace.capture import python_facts

_PROGRAM = Path(python_facts.__file__).read_text()


def probe(python: str, import_torch: bool = False, timeout: float = 60, module: str | None = None) -> dict:
    """``python_facts.facts`` as ``python`` sees them; ``{"error": why}`` when it does not run.

    Keys: python, nvtx, torch, cuda_version (the CUDA torch was built for; versions or None),
    autotrace, torch_cuda (bools); with ``import_torch`` also cuda (available), gpus, or torch_error; with
    ``module`` also module_found (``python -m module`` would find it).
    """
    if not import_torch and os.path.realpath(python) == os.path.realpath(sys.executable):
        return python_facts.facts(module=module)  # the same answer, without starting an interpreter
    argv = ([python, "-c", _PROGRAM] + (["--import-torch"] if import_torch else [])
            + (["--module", module] if module else []))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
