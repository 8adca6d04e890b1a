"""``.qdstrm`` -> ``.nsys-rep`` with QdstrmImporter, for when nsys could not import its own capture.

nsys only looks for its importer beside its real directory, which Debian's split package
gets wrong: it then exits 0, says "Importer error status" and leaves the raw stream.
QdstrmImporter appends to the file it imports, so a .qdstrm the user names (``analyze run.qdstrm``, the
capture an interrupted run left) is imported from a private copy: the user's file stays byte for byte.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from nvtx_trace.capture.locate import Nsys
from nvtx_trace.capture.nsys_log import NsysLog, run_step, tail
from nvtx_trace.errors import NsysFailedError
from nvtx_trace.files import stem_of, with_suffix


def import_qdstrm(nsys: Nsys, qdstrm: str | os.PathLike, out: str | os.PathLike | None = None,
                  *, progress: Callable[[str], None] | None = None, log: NsysLog | None = None,
                  shown: Path | None = None) -> Path:
    """``QdstrmImporter -i x.qdstrm`` -> ``x.nsys-rep`` (replacing it); its output goes to ``log``. ``shown``: the
    file messages name (the user's, when ``qdstrm`` is a private copy of it)."""
    qdstrm = Path(qdstrm)
    named = shown or qdstrm
    target = Path(out) if out else with_suffix(stem_of(qdstrm), ".nsys-rep")
    if nsys.importer is None:
        raise NsysFailedError(f"{nsys.importer_problem}; the capture is left as {qdstrm}")
    if progress:
        progress("Importing the capture…")
    target.unlink(missing_ok=True)
    argv = [str(nsys.importer), "-i", str(qdstrm), "-o", str(target)]
    returncode, output = run_step("import", argv, log,
                                  f"could not run {nsys.importer}: {{why}}; the capture is left as {named}")
    if returncode != 0 or not target.exists() or target.stat().st_size == 0:
        where = f" ({log.where()})" if log is not None else ""
        raise NsysFailedError(
            f"QdstrmImporter failed on {named} (status {returncode}): {tail(output) or 'no output'}{where}"
        )
    return target


def import_copy(nsys: Nsys, qdstrm: str | os.PathLike, out: str | os.PathLike, *,
                progress: Callable[[str], None] | None = None, log: NsysLog | None = None) -> Path:
    """``import_qdstrm`` of a private copy of ``qdstrm`` made beside ``out`` and removed after: the importer
    writes into its input, and the user's file is an input that must not change."""
    from nvtx_trace.files import cannot_write

    out = Path(out)
    if nsys.importer is None:
        raise NsysFailedError(f"{nsys.importer_problem}; the capture is left as {qdstrm}")
    copy = out.with_name(f".{out.name}.{os.getpid()}.import.qdstrm")
    try:
        try:
            shutil.copyfile(qdstrm, copy)
        except OSError as exc:
            raise cannot_write(copy, exc) from None
        return import_qdstrm(nsys, copy, out, progress=progress, log=log, shown=Path(qdstrm))
    finally:
        copy.unlink(missing_ok=True)
