"""Names of the files a capture leaves: nsys appends its suffixes to a stem itself."""

from __future__ import annotations

import os
from pathlib import Path

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def stem_of(out: str | os.PathLike) -> Path:
    """``run.nsys-rep`` / ``run.qdstrm`` / ``run`` -> ``run``."""
    path = Path(out)
    for suffix in (*REPORT_SUFFIXES, ".qdstrm", ".sqlite"):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)])
    return path


def with_suffix(stem: Path, suffix: str) -> Path:
    """``stem`` + ``suffix`` (``Path.with_suffix`` would cut a dotted stem)."""
    return stem.with_name(stem.name + suffix)
