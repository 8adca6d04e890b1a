"""SQLite exports of Nsight Systems reports: made atomically, marked with the report they came from.

An interrupted export leaves a file that is not a database, so an export is written under a
temporary name, checked, then renamed. Every export we make carries a provenance table (the
report's name, size and a digest of its ends), so an export beside a report is reused only
when it really came from that report; any other is left alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Callable

from nvtx_trace.analyzer.trace.opening import SQLITE_MAGIC
from nvtx_trace.capture.locate import Nsys, find_nsys
from nvtx_trace.capture.nsys_log import NsysLog, run_step, tail
from nvtx_trace.capture.qdstrm import import_copy
from nvtx_trace.errors import BadReportError, NsysFailedError, NsysNotFoundError
from nvtx_trace.files import REPORT_SUFFIXES, stem_of, with_suffix

Progress = Callable[[str], None]


def is_sqlite(path: str | os.PathLike) -> bool:
    """True for a complete SQLite database: magic header and a readable schema."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != SQLITE_MAGIC:
                return False
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return con.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False


def export_sqlite(nsys: Nsys, rep: str | os.PathLike, out: str | os.PathLike | None = None, *,
                  progress: Progress | None = None, source: Path | None = None, log: NsysLog | None = None) -> Path:
    """``nsys export --type sqlite`` into a temporary name, checked, then renamed onto ``out``.

    An interrupted export leaves a file that is not a database, so ``out`` is only ever
    replaced by a complete one. nsys's output goes to ``log`` (its tail into the error).
    """
    rep = Path(rep)
    out = Path(out) if out else with_suffix(stem_of(rep), ".sqlite")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.partial.sqlite")
    if progress:
        progress("Exporting to SQLite…")
    argv = [str(nsys.path), "export", "--type", "sqlite", "-f", "true", "-o", str(tmp), str(rep)]
    try:
        returncode, output = run_step("export", argv, log, f"could not run {nsys.path} export: {{why}}")
        if returncode < 0 and returncode != -signal.SIGXFSZ:  # killed (we were interrupted): it may lack tables
            raise NsysFailedError(f"nsys export of {rep} was stopped ({signal.Signals(-returncode).name}); "
                                  f"{rep} is kept, export it again")
        if is_sqlite(tmp):
            try:
                _mark_source(tmp, Path(source or rep))  # the file the user named (a .qdstrm, not its import)
            except (OSError, sqlite3.Error) as exc:
                raise NsysFailedError(f"could not finish the export of {rep} ({exc}); free some space and "
                                      "export it again") from None
        if not is_sqlite(tmp):
            space = _space_problem(out.parent, returncode, output)
            if space:
                raise NsysFailedError(f"nsys export of {rep} stopped: {space}; {rep} is kept, "
                                      f"export it again once there is room")
            where = f" ({log.where()})" if log is not None else ""
            raise NsysFailedError(
                f"nsys export of {rep} gave no valid SQLite file (status {returncode}): "
                f"{tail(output) or 'no output'}{where}"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _space_problem(directory: Path, returncode: int, log: str) -> str | None:
    """Why an export could not write its file, when it is room: a file-size limit or a full disk."""
    if returncode == -signal.SIGXFSZ:
        return "it hit the file-size limit (SIGXFSZ; see ulimit -f)"
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    if free is not None and free < 64 << 20 or re.search(r"No space left|ENOSPC|disk full", log, re.I):
        where = f"only {free / 2**20:.0f} MiB free on {directory}" if free is not None else f"{directory} is full"
        return f"the disk is full ({where})"
    return None


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK)


PROVENANCE_TABLE = "nvtx_trace_source"  # written into the exports we make: which report they came from


def _fingerprint(rep: Path) -> tuple[str, int, str]:
    """(name, size, SHA-256 of the first and last MiB): cheap on multi-GB reports, and changes with them."""
    size = rep.stat().st_size
    digest = hashlib.sha256()
    with open(rep, "rb") as f:
        digest.update(f.read(1 << 20))
        if size > 1 << 20:
            f.seek(max(1 << 20, size - (1 << 20)))
            digest.update(f.read(1 << 20))
    return rep.name, size, digest.hexdigest()


def _mark_source(db: Path, rep: Path) -> None:
    """Write which report this export came from into the export itself (a table of one row)."""
    import sqlite_utils

    name, size, head = _fingerprint(rep)
    conn = sqlite3.connect(db)
    try:
        table = sqlite_utils.Database(conn)[PROVENANCE_TABLE]
        table.insert({"id": 1, "name": name, "size": size, "sha256": head}, pk="id", replace=True)
        conn.commit()
    finally:
        conn.close()


def _fresh_sqlite(candidate: Path, rep: Path) -> bool:
    """An export we made from exactly this report (another export beside it, however new, is not trusted)."""
    if not candidate.is_file() or not is_sqlite(candidate):
        return False
    try:
        conn = sqlite3.connect(f"file:{candidate}?mode=ro", uri=True)
        try:
            row = conn.execute(f"SELECT name, size, sha256 FROM {PROVENANCE_TABLE}").fetchone()
        finally:
            conn.close()
        return row is not None and tuple(row) == _fingerprint(rep)
    except (OSError, sqlite3.Error):
        return False


def cache_dir() -> Path:
    """Where exports go when the report's directory is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(Path(base).parent if not Path(base).exists() else base, os.W_OK):
        base = tempfile.gettempdir()
    return Path(base) / "nvtx-trace"


def _cached_name(source: Path, suffix: str) -> Path:
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / key / (stem_of(source).name + suffix)


def ensure_sqlite(path: str | os.PathLike, nsys: Nsys | None = None, *,
                  progress: Progress | None = None) -> Path:
    """An SQLite export for ``path`` (.sqlite, .nsys-rep, .qdrep or .qdstrm), never modifying it.

    An export we made from exactly this report (provenance table, fingerprint of the report)
    is reused; otherwise one is made next to it, or in the cache directory when that folder is
    not writable or already holds an export we did not make from this report.
    """
    path = Path(path)
    if not path.is_file():
        raise BadReportError(f"{path}: no such file")
    suffix = next((s for s in (*REPORT_SUFFIXES, ".qdstrm") if path.name.endswith(s)), None)
    if suffix is None:
        if not is_sqlite(path):
            raise BadReportError(f"{path} is neither an SQLite export nor a .nsys-rep/.qdrep report")
        return path
    stem = stem_of(path)
    beside = with_suffix(stem, ".sqlite")
    cached = _cached_name(path, ".sqlite")
    for candidate in (beside, cached):
        if _fresh_sqlite(candidate, path):
            return candidate
    if nsys is None:
        try:
            nsys = find_nsys()
        except NsysNotFoundError as exc:
            raise NsysNotFoundError(
                f"{path} is a {suffix} file; {'importing and ' if suffix == '.qdstrm' else ''}"
                f"exporting it needs nsys ({exc}), or export it on a machine that has nsys: "
                f"nsys export --type sqlite {path}"
            ) from None
    # never over a file we did not make from this report (a text file, a link, another export): the user's own
    # file named like our export stays as it is, and the export goes to the private cache instead, said
    taken = [beside] if _taken(beside, path) else []
    target = beside if _writable(path.parent) and not taken else cached
    if taken:
        print(f"nvtx-trace: {taken[0]} is not an export nvtx-trace made of {path.name}, so it is left as it is; the "
              f"export goes to {target.parent}", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    rep = path
    if suffix == ".qdstrm":
        # imported beside it where no file has the name; else privately: a report of that name, older or newer,
        # is somebody's (it was overwritten, or analyzed in the capture's place: 40 steps where it holds 60)
        rep = target.with_suffix(".nsys-rep")
        if rep.exists() or rep.is_symlink():
            rep = _cached_name(path, ".nsys-rep")
            rep.parent.mkdir(parents=True, exist_ok=True)
        rep = import_copy(nsys, path, rep, progress=progress)  # the importer appends to its input
    return export_sqlite(nsys, rep, target, progress=progress, source=path)


REPORT_MAGIC = b"NVIDIA"  # the first bytes of every .nsys-rep nsys writes ("NVIDIA Tegra Profiler Report ...")


def _looks_like_report(p: Path) -> bool:
    """A real file that starts as nsys's reports do: an import of ours, not a text file that took the name."""
    try:
        if p.is_symlink() or not p.is_file():
            return False
        with open(p, "rb") as fh:
            return fh.read(len(REPORT_MAGIC)) == REPORT_MAGIC
    except OSError:
        return False


def _taken(p: Path, rep: Path) -> bool:
    """``p`` exists and is not ours to replace: an .sqlite that is not our export of ``rep``, an .nsys-rep that is
    no report (a link, or a file of something else)."""
    if not (p.exists() or p.is_symlink()):
        return False
    if p.suffix == ".sqlite":
        return p.is_symlink() or not _fresh_sqlite(p, rep)
    return not _looks_like_report(p)


# Reports shipped compressed (sample_reports/*.sqlite.xz): read through a private copy, never one beside them.
COMPRESSED = {".xz": "lzma", ".gz": "gzip", ".zst": "zstandard"}


def decompressed(path: Path) -> Path:
    """The report inside ``path`` (.xz, .gz, .zst), as a file of the user's cache folder (private, made once per
    version of the input: its path, size and time); the input is only read."""
    module = COMPRESSED[path.suffix]
    if not path.is_file():
        raise BadReportError(f"{path}: no such file")
    target = _cached_name(path, "")
    target = target.with_name(path.name[: -len(path.suffix)])
    if target.is_file():
        return target
    try:
        if module == "zstandard":
            try:
                import zstandard
            except ImportError:
                raise BadReportError(f"{path}: reading .zst needs the zstandard package (pip install 'nvtx-trace[zst]'), or "
                                     f"decompress it first: zstd -d {path}") from None
            opener = zstandard.open
        else:
            opener = __import__(module).open
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with opener(path, "rb") as src, os.fdopen(fd, "wb") as dst:
                _copy_report(path, target.suffix, src, dst, target.parent)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except BadReportError:
        raise
    except Exception as exc:  # noqa: BLE001 - OSError, EOFError, lzma.LZMAError, zlib.error, zstandard.ZstdError
        raise BadReportError(f"{path}: cannot be decompressed ({type(exc).__name__}: {exc}); check the file, or "
                             "decompress it by hand") from None
    return target


DECOMPRESSED_FROM: dict[str, str] = {}  # a private copy -> the compressed file the user named (error lines)


def as_given(text: str) -> str:
    """``text`` with each private decompressed copy named as the user's own file."""
    for copy, given in DECOMPRESSED_FROM.items():
        text = text.replace(copy, f"{given} (decompressed)")
    return text


KEEP_FREE = 1 << 30  # decompression stops before the cache's file system has less than this left
INNER_MAGIC = {".sqlite": SQLITE_MAGIC, ".nsys-rep": REPORT_MAGIC, ".qdrep": REPORT_MAGIC}


def _copy_report(path: Path, inner: str, src, dst, folder: Path) -> None:
    """Copy what ``src`` holds while it is what its name says: the first bytes are checked before more is
    written (a file of zeros compressed a thousandfold is no report, and is never written whole), and the copy
    stops before it fills the disk."""
    first = src.read(1 << 20)
    magic = INNER_MAGIC.get(inner)
    if magic is not None and not first.startswith(magic):
        raise BadReportError(f"{path}: what it holds is not {'an SQLite export' if inner == '.sqlite' else 'a report'} "
                             f"(it starts with {first[:16]!r}); check the file")
    dst.write(first)
    written = len(first)
    while chunk := src.read(1 << 20):
        dst.write(chunk)
        written += len(chunk)
        if written % (64 << 20) < len(chunk) and shutil.disk_usage(folder).free < KEEP_FREE:
            raise BadReportError(f"{path}: decompressed, it would leave less than {KEEP_FREE >> 30} GiB free in "
                                 f"{folder} ({written >> 20} MiB written so far); decompress it by hand where there "
                                 "is room, and analyze that file")


def as_sqlite(path, nsys: str | None = None) -> Path:
    """A report as its SQLite export: a ``.nsys-rep``/``.qdrep``/``.qdstrm`` is exported (or its export reused)
    before any analysis, so the analyzer reads only SQLite; a compressed one is read from a private copy.
    ``nsys``: the --nsys the user named."""
    path = Path(path)
    if path.suffix in COMPRESSED:
        given, path = path, decompressed(path)
        DECOMPRESSED_FROM[str(path)] = str(given)
    if path.suffix not in (".nsys-rep", ".qdrep", ".qdstrm"):
        return path
    from nvtx_trace.capture.locate import find_nsys

    return ensure_sqlite(path, nsys=find_nsys(nsys) if nsys else None)
