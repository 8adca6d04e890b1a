"""``.qdstrm`` -> ``.nsys-rep`` with QdstrmImporter, for when nsys could not import its own capture.

nsys only looks for its importer beside its real directory, which Debian's split package
gets wrong: it then exits 0, says "Importer error status" and leaves the raw stream.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from nvtx_trace.capture.locate import Nsys
from nvtx_trace.capture.nsys_log import NsysLog, run_step, tail
from nvtx_trace.capture.paths import stem_of, with_suffix
from nvtx_trace.errors import NsysFailedError


def import_qdstrm(nsys: Nsys, qdstrm: str | os.PathLike, out: str | os.PathLike | None = None,
                  *, progress: Callable[[str], None] | None = None, log: NsysLog | None = None) -> Path:
    """``QdstrmImporter -i x.qdstrm`` -> ``x.nsys-rep`` (replacing it); its output goes to ``log``."""
    qdstrm = Path(qdstrm)
    target = Path(out) if out else with_suffix(stem_of(qdstrm), ".nsys-rep")
    if nsys.importer is None:
        raise NsysFailedError(f"{nsys.importer_problem}; the capture is left as {qdstrm}")
    if progress:
        progress("Importing the capture…")
    target.unlink(missing_ok=True)
    argv = [str(nsys.importer), "-i", str(qdstrm), "-o", str(target)]
    returncode, output = run_step("import", argv, log,
                                  f"could not run {nsys.importer}: {{why}}; the capture is left as {qdstrm}")
    if returncode != 0 or not target.exists() or target.stat().st_size == 0:
        where = f" ({log.where()})" if log is not None else ""
        raise NsysFailedError(
            f"QdstrmImporter failed on {qdstrm} (status {returncode}): {tail(output) or 'no output'}{where}"
        )
    return target
