"""The only code that finds and drives the Nsight Systems CLI (nsys).

Why it exists: nsys installs differ (CUDA toolkit, NVIDIA repos, the copy inside
Nsight Compute, Debian's split layout), exit codes lie (a run whose importer is
missing exits 0 and leaves only a ``.qdstrm``), and an interrupted export leaves
a file that is not a database. So success is judged by the files produced, the
``.qdstrm`` -> ``.nsys-rep`` import is done here when nsys could not, and every
SQLite file is checked before it is trusted.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from nvtx_trace.errors import BadReportError, NsysFailedError, NsysNotFoundError

Progress = Callable[[str], None]

INSTALL_HINT = (
    "install Nsight Systems (Debian/Ubuntu non-free package 'nsight-systems', or NVIDIA's "
    "installer from developer.nvidia.com/nsight-systems) or point --nsys / $NSYS at an nsys binary"
)

# (how it was found, glob) in search order after --nsys, $NSYS and PATH; newest version first
# within one glob. Tests replace this tuple to simulate a machine without nsys.
KNOWN_LOCATIONS: tuple[tuple[str, str], ...] = (
    ("CUDA toolkit", "/usr/local/cuda*/bin/nsys"),
    ("CUDA toolkit", "/usr/local/cuda*/nsight-systems-*/bin/nsys"),
    ("Nsight Systems install", "/opt/nvidia/nsight-systems/*/bin/nsys"),
    ("Nsight Systems install", "/opt/nvidia/nsight-systems-cli/*/bin/nsys"),
    ("Nsight Systems install", "/opt/nvidia/nsight-systems*/*/target-linux-*/nsys"),
    ("Nsight Compute bundle", "/opt/nvidia/nsight-compute/*/host/target-linux-*/nsys"),
    ("Debian package", "/usr/lib/*-linux-gnu/nsight-systems/target-linux-*/nsys"),
)
# Importers that do not sit next to nsys's real directory (Debian splits host and target).
KNOWN_IMPORTERS: tuple[str, ...] = ("/usr/lib/nsight-systems/host-linux-*/QdstrmImporter",)

_VERSION_RE = re.compile(r"(?<![\d.])(\d{4}\.\d+\.\d+)")
from nvtx_trace.export_file import SQLITE_MAGIC as _SQLITE_MAGIC  # noqa: E402

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


@dataclass(frozen=True)
class Nsys:
    """A working nsys CLI: where it is, its version ("YYYY.N.N") and its importer."""

    path: Path
    version: str
    found_via: str  # "--nsys", "$NSYS", "PATH", "CUDA toolkit", "Debian package", ...
    importer: Path | None = None
    importer_version: str | None = None  # None when the importer could not even run
    importer_problem: str | None = None  # why the importer is missing, unusable or mismatched
    imports_itself: bool = False  # the importer sits in nsys's own install, so nsys runs it itself

    @property
    def year(self) -> int:
        return int(self.version.split(".")[0])


@dataclass
class ProfileResult:
    """What one ``nsys profile`` left behind. ``rep`` is None when no report could be made."""

    returncode: int
    rep: Path | None
    qdstrm: Path | None
    log: str = ""  # nsys's output, only when captured (capture_output=True)
    interrupted: bool = False  # a SIGINT/SIGTERM was forwarded to nsys
    signal: int | None = None  # which one
    imported_by_us: bool = False  # nsys could not import the .qdstrm; we ran QdstrmImporter
    problem: str | None = None  # why there is no report
    pid: int | None = None  # nsys's pid, also the process group of the program it started

    def require_report(self) -> Path:
        """The ``.nsys-rep``, or NsysFailedError saying why there is none."""
        if self.rep is None:
            raise NsysFailedError(self.problem or "nsys produced no report")
        return self.rep


# ---------------------------------------------------------------- finding nsys


def parse_version(text: str) -> str | None:
    """Leading YYYY.N.N of an ``nsys --version`` line; builds differ in what follows."""
    match = _VERSION_RE.search(text or "")
    return match.group(1) if match else None


def _run_quiet(argv: Sequence[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        errors="replace", timeout=timeout, **kw,
    )


@functools.lru_cache(maxsize=None)
def _probe(path: str) -> tuple[bool, str]:
    """(ran with status 0, its output) of ``<path> --version``; the output is the error when it failed."""
    try:
        proc = _run_quiet([path, "--version"], timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0, out if proc.returncode == 0 else _tail(out) or f"exit status {proc.returncode}"


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return " / ".join(kept[-lines:])


def _as_executable(given: str) -> Path | None:
    """An nsys path from a file or an install directory (dir, dir/bin, dir/target-linux-x64)."""
    path = Path(given).expanduser()
    if path.is_dir():
        for sub in ("nsys", "bin/nsys", "target-linux-x64/nsys", "host/target-linux-x64/nsys"):
            if os.access(path / sub, os.X_OK) and (path / sub).is_file():
                return path / sub
        return None
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which(given)
    return Path(found) if found else None


def _candidates(explicit: str | None) -> Iterable[tuple[str, str, bool]]:
    """(how, path, strict): a strict candidate that does not work is an error, not a skip."""
    if explicit:
        yield "--nsys", explicit, True
        return
    if os.environ.get("NSYS"):
        yield "$NSYS", os.environ["NSYS"], True
        return
    on_path = shutil.which("nsys")
    if on_path:
        yield "PATH", on_path, False
    for how, pattern in KNOWN_LOCATIONS:
        for hit in sorted(glob.glob(pattern), key=_version_sort_key, reverse=True):
            yield how, hit, False


def _version_sort_key(path: str) -> tuple:
    version = parse_version(path) or "0.0.0"
    return tuple(int(p) for p in version.split(".")), path


def find_nsys(explicit: str | None = None) -> Nsys:
    """The nsys to use: --nsys, then $NSYS, PATH, and the usual install locations."""
    seen: set[str] = set()
    for how, given, strict in _candidates(explicit):
        exe = _as_executable(given)
        if exe is None:
            if strict:
                raise NsysNotFoundError(f"{how} {given}: no nsys executable there; {INSTALL_HINT}")
            continue
        real = str(exe.resolve())
        if real in seen:
            continue
        seen.add(real)
        ran, out = _probe(str(exe))
        version = parse_version(out) if ran else None
        if version is None:
            if strict:
                why = out if not ran else "its --version names no Nsight Systems version"
                raise NsysNotFoundError(f"{how} {given} is not a working nsys ({why})")
            continue
        importer, imp_version, problem, own = find_importer(exe, version)
        return Nsys(exe, version, how, importer, imp_version, problem, own)
    raise NsysNotFoundError(f"Nsight Systems (nsys) not found: {INSTALL_HINT}")


def _importer_candidates(nsys_path: Path) -> tuple[list[Path], list[Path]]:
    """(importers of nsys's own install, others): nsys itself only looks in the first place."""
    real = nsys_path.resolve()
    # target-linux-x64/nsys -> ../host-linux-x64; <ver>/bin/nsys (a wrapper) -> ../host-linux-x64;
    # Nsight Compute: host/target-linux-x64/nsys -> host/linux-desktop-glibc_*-x64.
    own: list[Path] = []
    for base in sorted({real.parent.parent, nsys_path.parent.parent}):
        for pattern in ("host-linux-x64", "host-linux-*", "linux-desktop-*", "*/host-linux-*"):
            own += [Path(p) / "QdstrmImporter" for p in sorted(glob.glob(str(base / pattern)))]
    others = [Path(p) for pattern in KNOWN_IMPORTERS for p in sorted(glob.glob(pattern))]
    seen: set[str] = set()

    def usable(paths: list[Path]) -> list[Path]:
        kept = []
        for path in paths:
            key = str(path.resolve())
            if key not in seen and path.is_file() and os.access(path, os.X_OK):
                seen.add(key)
                kept.append(path)
        return kept

    return usable(own), usable(others)


def find_importer(nsys: Path | str, version: str) -> tuple[Path | None, str | None, str | None, bool]:
    """(importer, its version or build, problem, nsys can run it itself) for this nsys.

    The importer turns ``.qdstrm`` into ``.nsys-rep``. nsys only looks beside its real
    directory, which Debian's split package and partial copies get wrong. One from nsys's
    own install is trusted; elsewhere the version must match (2022.4 importers print
    "2022.4.2.1-df9881f", 2025.3 ones only a build number).
    """
    own, others = _importer_candidates(Path(nsys))
    broken: tuple[Path, str] | None = None
    mismatched: tuple[Path, str | None, str, bool] | None = None
    for cand in own + others:
        ran, out = _probe(str(cand))
        if not ran:
            broken = broken or (cand, f"{cand} does not run ({out})")
            continue
        cand_version = parse_version(out) or out.replace("NVIDIA Nsight Systems", "").strip() or None
        if cand in own or parse_version(out) == version:
            return cand, cand_version, None, cand in own
        mismatched = mismatched or (cand, cand_version, f"{cand} is {cand_version}, nsys is {version}", False)
    if mismatched:
        return mismatched
    if broken:
        return broken[0], None, broken[1], False
    return None, None, f"no QdstrmImporter found near {Path(nsys).resolve().parent}", False


# ---------------------------------------------------------------- probing capabilities


@functools.lru_cache(maxsize=None)
def _profile_help(path: str) -> str:
    try:
        proc = _run_quiet([path, "profile", "--help"], timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout + proc.stderr


def supported_traces(nsys: Nsys) -> frozenset[str]:
    """APIs this nsys can trace (``-t``), read once from ``nsys profile --help``."""
    text = _profile_help(str(nsys.path))
    match = re.search(r"-t, --trace=(.*?)(?:Select the API|\n\s*\n\s*-)", text, re.S)
    return frozenset(re.findall(r"'([\w-]+)'", match.group(1))) - {"none"} if match else frozenset()


def supported_options(nsys: Nsys) -> frozenset[str]:
    """Long options of ``nsys profile`` (e.g. ``--trace-fork-before-exec``, ``--pytorch``)."""
    return frozenset(re.findall(r"^\s*(?:-\w, )?(--[\w-]+)=", _profile_help(str(nsys.path)), re.M))


def pick_traces(nsys: Nsys, wanted: Sequence[str] = ("cuda", "nvtx", "osrt", "cudnn", "cublas")) -> list[str]:
    """The wanted APIs this nsys supports, in the order asked (all of them if probing failed)."""
    known = supported_traces(nsys)
    return [t for t in wanted if t in known] if known else list(wanted)


# ---------------------------------------------------------------- profiling


def stem_of(out: str | os.PathLike) -> Path:
    """``run.nsys-rep`` / ``run.qdstrm`` / ``run`` -> ``run``: nsys appends suffixes itself."""
    path = Path(out)
    for suffix in (*REPORT_SUFFIXES, ".qdstrm", ".sqlite"):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)])
    return path


class _Forwarder:
    """While nsys runs, pass our SIGINT/SIGTERM to it exactly once.

    nsys runs in its own process group so that a terminal Ctrl-C reaches it only through
    us: a second SIGINT while nsys is writing the report makes it drop the report (seen
    with 2022.4). Later signals are ignored until a third, which abandons the report.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, proc: subprocess.Popen, notice: Progress | None):
        self.proc, self.notice, self.count, self.saved = proc, notice, 0, {}
        self.first: int | None = None  # the signal that was forwarded

    def _handle(self, signum, _frame) -> None:
        self.count += 1
        if self.proc.poll() is not None:
            return
        if self.count == 1:
            self.first = signum
            self.proc.send_signal(signum)
            if self.notice:
                self.notice("Stopping the program; nsys is writing the report…")
        elif self.count == 2 and self.notice:
            self.notice("Still writing the report; interrupt again to abandon it")
        elif self.count >= 3:
            self.proc.kill()

    def __enter__(self) -> "_Forwarder":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self.saved.items():
            signal.signal(sig, old)


def profile_command(nsys: Nsys, stem, trace: Sequence[str], extra: Sequence[str], argv: Sequence[str]) -> list[str]:
    """The one place the ``nsys profile`` command line is built (run prints it, profile runs it)."""
    return [str(nsys.path), "profile", "-o", str(stem), "-f", "true", "-t", ",".join(trace), *extra, *argv]


def profile(
    nsys: Nsys,
    argv: Sequence[str],
    out_stem: str | os.PathLike,
    *,
    trace: Sequence[str],
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    capture_output: bool = False,
    progress: Progress | None = None,
) -> ProfileResult:
    """Run ``nsys profile -o out_stem -f true -t trace extra argv`` and make sure a report exists.

    The program's stdin/stdout/stderr are inherited (nsys itself tees stdout/stderr into the
    report, so the program sees pipes, not a terminal). Existing ``out_stem.nsys-rep`` /
    ``.qdstrm`` are replaced. Success is judged by the files, not the exit code: when only a
    ``.qdstrm`` appears, the matching QdstrmImporter is run here.
    """
    stem = Path(os.path.abspath(Path(cwd or ".") / stem_of(out_stem)))
    stem.parent.mkdir(parents=True, exist_ok=True)
    rep_path, qd_path = stem.with_name(stem.name + ".nsys-rep"), stem.with_name(stem.name + ".qdstrm")
    for stale in (rep_path, qd_path):
        stale.unlink(missing_ok=True)
    cmd = profile_command(nsys, stem, trace, extra, argv)
    pipe = subprocess.PIPE if capture_output else None
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        proc = subprocess.Popen(
            cmd, env=None if env is None else dict(env), cwd=cwd,
            stdout=pipe, stderr=subprocess.STDOUT if capture_output else None,
            text=capture_output, errors="replace" if capture_output else None, **group,
        )
    except OSError as exc:
        raise NsysFailedError(f"could not start {nsys.path}: {exc}") from exc
    with _Forwarder(proc, progress) as fwd:
        log = ""
        if capture_output:
            log = _drain(proc)
        returncode = _wait(proc)
    result = ProfileResult(returncode, None, qd_path if qd_path.exists() else None, log,
                           interrupted=fwd.count > 0, pid=proc.pid, signal=fwd.first)
    if rep_path.exists() and rep_path.stat().st_size > 0:
        result.rep = rep_path
    elif result.qdstrm is not None:
        try:
            result.rep = import_qdstrm(nsys, result.qdstrm, progress=progress)
            result.imported_by_us = True
        except NsysFailedError as exc:
            result.problem = str(exc)
    else:
        result.problem = (
            f"nsys exited with status {returncode} and wrote neither {rep_path.name} nor {qd_path.name}"
            + (f": {_tail(log)}" if log else "")
        )
    return result


def live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process (Linux /proc; [] elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
            if fields[0] != "Z":
                found.append((int(entry.parent.name), int(fields[1]), int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``: what nsys left running."""
    return sorted(pid for pid, _, group in live_processes() if group == pgid)


def _drain(proc: subprocess.Popen) -> str:
    """Read captured output; a signal arriving mid-read must not stop the collection."""
    chunks = []
    while True:
        try:
            chunk = proc.stdout.read()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
        if not chunk:
            return "".join(chunks)
        chunks.append(chunk)


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:  # a handler installed elsewhere raised; keep waiting for the report
            continue


# ---------------------------------------------------------------- import and export


def import_qdstrm(nsys: Nsys, qdstrm: str | os.PathLike, out: str | os.PathLike | None = None,
                  *, progress: Progress | None = None) -> Path:
    """``QdstrmImporter -i x.qdstrm`` -> ``x.nsys-rep`` (replacing it), for when nsys could not."""
    qdstrm = Path(qdstrm)
    target = Path(out) if out else stem_of(qdstrm).with_name(stem_of(qdstrm).name + ".nsys-rep")
    if nsys.importer is None:
        raise NsysFailedError(f"{nsys.importer_problem}; the capture is left as {qdstrm}")
    if progress:
        progress("Importing the capture…")
    target.unlink(missing_ok=True)
    try:
        proc = _run_quiet([str(nsys.importer), "-i", str(qdstrm), "-o", str(target)], timeout=None)
    except OSError as exc:
        raise NsysFailedError(f"could not run {nsys.importer}: {exc}; the capture is left as {qdstrm}") from exc
    if proc.returncode != 0 or not target.exists() or target.stat().st_size == 0:
        tail = _tail(proc.stdout + proc.stderr)
        raise NsysFailedError(
            f"QdstrmImporter failed on {qdstrm} (status {proc.returncode}): {tail or 'no output'}"
        )
    return target


def is_sqlite(path: str | os.PathLike) -> bool:
    """True for a complete SQLite database: magic header and a readable schema."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            if fh.read(16) != _SQLITE_MAGIC:
                return False
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return con.execute("PRAGMA quick_check(1)").fetchone()[0] == "ok"
        finally:
            con.close()
    except (OSError, sqlite3.Error):
        return False


def export_sqlite(nsys: Nsys, rep: str | os.PathLike, out: str | os.PathLike | None = None,
                  *, progress: Progress | None = None, source: Path | None = None) -> Path:
    """``nsys export --type sqlite`` into a temporary name, checked, then renamed onto ``out``.

    An interrupted export leaves a file that is not a database, so ``out`` is only ever
    replaced by a complete one.
    """
    rep = Path(rep)
    out = Path(out) if out else stem_of(rep).with_name(stem_of(rep).name + ".sqlite")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.partial.sqlite")
    if progress:
        progress("Exporting to SQLite…")
    try:
        try:
            proc = _run_quiet([str(nsys.path), "export", "--type", "sqlite", "-f", "true",
                               "-o", str(tmp), str(rep)], timeout=None)
        except OSError as exc:
            raise NsysFailedError(f"could not run {nsys.path} export: {exc}") from exc
        if is_sqlite(tmp):
            try:
                _mark_source(tmp, Path(source or rep))  # the file the user named (a .qdstrm, not its import)
            except (OSError, sqlite3.Error) as exc:
                raise NsysFailedError(f"could not finish the export of {rep} ({exc}); free some space and "
                                      "export it again") from None
        if not is_sqlite(tmp):
            space = _space_problem(out.parent, proc.returncode, proc.stdout + proc.stderr)
            if space:
                raise NsysFailedError(f"nsys export of {rep} stopped: {space}; {rep} is kept, "
                                      f"export it again once there is room")
            tail = _tail(proc.stdout + proc.stderr)
            raise NsysFailedError(
                f"nsys export of {rep} gave no valid SQLite file (status {proc.returncode}): {tail or 'no output'}"
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
    beside = stem.with_name(stem.name + ".sqlite")
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
    # never over an export we did not make from this report: that one goes to the cache instead
    foreign = is_sqlite(beside) and not _fresh_sqlite(beside, path)  # (a broken file is replaced)
    target = beside if _writable(path.parent) and not foreign else cached
    target.parent.mkdir(parents=True, exist_ok=True)
    rep = path
    if suffix == ".qdstrm":
        rep = target.with_suffix(".nsys-rep")
        if not (rep.is_file() and rep.stat().st_mtime >= path.stat().st_mtime):
            rep = import_qdstrm(nsys, path, rep, progress=progress)
    return export_sqlite(nsys, rep, target, progress=progress, source=path)


def nvtx_problem(nvtx_version: str | None, nsys_version: str) -> str | None:
    """Why ranges from this Python ``nvtx`` would not be recorded by this nsys, or None.

    Seen on nsys 2022.4: nvtx 0.2.11 is recorded, 0.2.12 to 0.2.17 leave only a
    domain-destroy event. 2025.3 records 0.2.11 too.
    """
    if not nvtx_version:
        return None
    try:
        nvtx = tuple(int(p) for p in re.findall(r"\d+", nvtx_version)[:3])
        nsys = tuple(int(p) for p in nsys_version.split(".")[:2])
    except ValueError:
        return None
    if nsys < (2023, 1) and (0, 2, 12) <= nvtx <= (0, 2, 17):
        return (f"nvtx {nvtx_version} ranges are not recorded by nsys {nsys_version}; "
                "pip install nvtx==0.2.11 (or use a newer nsys)")
    return None
