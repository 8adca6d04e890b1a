"""Which report files an ``analyze`` call names: files, folders of per-rank reports, or globs.

A folder or a glob the shell did not expand (``'out/rank*.sqlite'``) stands for every report in it,
in natural order (rank2 before rank10). A ``.nsys-rep`` beside its own ``.sqlite`` export is
counted once, as the export.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from nvtx_trace.errors import BadReportError, UsageError

REPORT_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
COMPRESSED_SUFFIXES = (".xz", ".gz", ".zst")  # a report shipped compressed (report.sqlite.xz)
GLOB_CHARS = re.compile(r"[*?\[]")


def natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def expand(args) -> list[Path]:
    """The report files the arguments name, each once, in the order given (folders and globs sorted)."""
    if isinstance(args, (str, Path)):
        args = [args]
    out: list[Path] = []
    for arg in args:
        if not str(arg).strip():
            raise UsageError("a report path is empty; give the report file, e.g. report.sqlite")
        try:
            out += _named_by(arg)
        except OSError as exc:  # a name too long, a folder we may not search
            raise BadReportError(f"{arg}: {exc.strerror or exc}; check the path") from None
    unique: list[Path] = []
    seen: set[Path] = set()
    for p in out:
        key = p.resolve() if p.exists() else p
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def _named_by(arg) -> list[Path]:
    """The reports one argument names: a folder's, a glob's, or the path itself."""
    path = Path(arg)
    if path.is_dir():
        found = _reports_in(sorted(path.iterdir(), key=natural_key))
        if not found:
            raise BadReportError(f"{path}: is a directory with no reports in it ({', '.join(REPORT_SUFFIXES)}); "
                                 "pass a report file, or the folder the per-rank reports were written to")
        return found
    if not path.exists() and GLOB_CHARS.search(str(arg)):
        found = _reports_in(sorted((Path(p) for p in glob.glob(str(arg))), key=natural_key))
        if not found:
            raise BadReportError(f"{arg}: no report matches this pattern; check the path and the pattern")
        return found
    return [path]  # a file, or a missing path that analyze reports on in its own words


def _reports_in(paths: list[Path]) -> list[Path]:
    def kind(p: Path) -> str:  # report.sqlite.xz is a .sqlite
        return p.with_suffix("").suffix if p.suffix in COMPRESSED_SUFFIXES else p.suffix

    def stem(p: Path) -> Path:
        return (p.with_suffix("") if p.suffix in COMPRESSED_SUFFIXES else p).with_suffix("")

    files = [p for p in paths if p.is_file() and kind(p) in REPORT_SUFFIXES]
    plain = {stem(p) for p in files if p.suffix == ".sqlite"}
    files = [p for p in files if p.suffix not in COMPRESSED_SUFFIXES or stem(p) not in plain]  # one of each
    exported = {stem(p) for p in files if kind(p) == ".sqlite"}
    return [p for p in files if kind(p) == ".sqlite" or stem(p) not in exported]
