"""Where nsys and its importer are, which version, and what ``nsys profile`` can trace.

Why it exists: nsys installs differ (CUDA toolkit, NVIDIA repos, the copy inside Nsight
Compute, Debian's split layout where nsys cannot find its own importer), so finding a
working pair is its own job.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from nvtx_trace.capture.nsys_log import run_quiet, tail
from nvtx_trace.errors import NsysNotFoundError

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


# ---------------------------------------------------------------- finding nsys


def parse_version(text: str) -> str | None:
    """Leading YYYY.N.N of an ``nsys --version`` line; builds differ in what follows."""
    match = _VERSION_RE.search(text or "")
    return match.group(1) if match else None


@functools.lru_cache(maxsize=None)
def _probe(path: str) -> tuple[bool, str]:
    """(ran with status 0, its output) of ``<path> --version``; the output is the error when it failed."""
    try:
        proc = run_quiet([path, "--version"], timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0, out if proc.returncode == 0 else tail(out) or f"exit status {proc.returncode}"


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
                option = "--nsys" if how == "--nsys" else "$NSYS (or --nsys)"
                raise NsysNotFoundError(f"{how} {given} is not a working nsys ({why}); point {option} at the nsys "
                                        "binary of an Nsight Systems install (its bin/nsys, or target-linux-x64/nsys), "
                                        "or leave it out to search PATH and the usual install folders")
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
        proc = run_quiet([path, "profile", "--help"], timeout=60)
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
