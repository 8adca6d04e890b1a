"""The files one ``nsys profile`` leaves, found and made whole once it ended: each rank's report (a ``%q{RANK}``
stem), a ``.qdstrm`` imported where nsys could not, and where no report could be made, why (a full disk, a rank that
wrote none) and the raw capture kept from nsys's private temporary folder (made here, so what nsys records while it
runs is ours to keep or remove). Kept apart from profile.py, which runs nsys and watches it.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

from nvtx_trace.capture import interrupts, own_output
from nvtx_trace.capture.locate import Nsys
from nvtx_trace.capture.nsys_log import NsysLog
from nvtx_trace.capture.qdstrm import import_qdstrm
from nvtx_trace.capture.torchrun import RANK_FIELD, rank_of
from nvtx_trace.errors import NsysFailedError
from nvtx_trace.files import stem_of, with_suffix

NO_SPACE = ("No space left on device", "ENOSPC", "Disk quota exceeded")


def no_space(log: NsysLog | None) -> str:
    """The cause, where nsys's log names a full disk (nsys itself exits 0 and says it only there)."""
    try:
        text = log.path.read_text(errors="replace") if log is not None else ""
    except OSError:
        return ""
    return " because a disk was full (nsys: \"No space left on device\")" if any(w in text for w in NO_SPACE) else ""


def raw_captures(scratch: str) -> list[Path]:
    """nsys's raw captures (``nsys-report-*.qdstrm``) left in its private folder: the recording itself, when nsys
    could not make the report of it."""
    try:
        return [p for p in Path(scratch).glob("nsys-report-*.qdstrm") if p.stat().st_size > 0]
    except OSError:
        return []


def kept_raw(raw: list[Path], stem: Path, full: bool) -> str:
    if not raw:
        return ""
    size = sum(p.stat().st_size for p in raw if p.exists()) / 2**20
    return (f"; the raw capture is kept in {raw[0]} ({size:.1f} MiB): {'free some space, then ' if full else ''}"
            f"nvtx-trace analyze {raw[0]} makes the report of it (or move it beside {stem.name}.nsys-rep first)")


def remove_scratch(scratch: str) -> None:
    """nsys's private folder removed; once more a moment later where something of nsys's that was still ending
    wrote into it again (seen once under load, a signal as nsys started)."""
    for _attempt in range(5):
        shutil.rmtree(scratch, ignore_errors=True)
        time.sleep(0.1)
        if not os.path.exists(scratch):
            return


def make_scratch(env: dict) -> str | None:
    """A private temporary folder for nsys (TMPDIR), the user's own kept for the program; None where none can
    be made (nsys then uses the user's, as before)."""
    import tempfile

    try:
        folder = tempfile.mkdtemp(prefix="nvtx-trace-nsys-", dir=env.get("TMPDIR") or None)
    except OSError:
        return None
    env[own_output.TMPDIR_ENV] = env.get("TMPDIR", "")
    env["TMPDIR"] = folder
    return folder


MAX_PARALLEL_IMPORTS = 4  # importing or exporting a big report takes a core and GBs of memory


def files_of(stem: Path, suffixes: Sequence[str]) -> list[Path]:
    """The files a stem names, ``%q{RANK}`` standing for a rank number only (``rank0_baseline.nsys-rep``,
    the user's, is none of ours)."""
    if RANK_FIELD not in stem.name:
        return [with_suffix(stem, s) for s in suffixes]
    before, after = stem.name.split(RANK_FIELD, 1)
    named = re.compile(re.escape(before) + r"\d+" + re.escape(after) + "(" + "|".join(map(re.escape, suffixes)) + ")$")
    return sorted(p for p in stem.parent.glob(before + "*") if named.match(p.name))


def missing_ranks(stems: list[Path], ranks: int | None) -> str | None:
    """Which ranks wrote no report: of the block of ``ranks`` this host runs when the launch says how many (on
    node 2 of a 4-per-node job, ranks 4-7), else the holes in the numbers."""
    written = {rank_of(s) for s in stems} - {None}
    if not written:
        return None
    first = min(written) // ranks * ranks if ranks else min(written)
    block = set(range(first, first + ranks)) if ranks else set()
    expected = block if written <= block else set(range(first, max(written) + 1))
    missing = sorted(expected - written)
    if not missing:
        return None
    which = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    return (f"rank{'s' if len(missing) > 1 else ''} {which} wrote no report ({len(written)} of "
            f"{len(expected)} did): that rank or its nsys ended before writing one; its output above or nsys.log "
            "says why; the analysis covers the ranks that wrote one")


def stems_written(stem: Path) -> list[Path]:
    """Each rank's stem, in rank order (rank2 before rank10)."""
    found = {stem_of(p) for p in files_of(stem, (".nsys-rep", ".qdstrm"))}
    return sorted(found, key=lambda p: (rank_of(p) is None, rank_of(p) or 0, p.name))


def collect(nsys: Nsys, stem: Path, log: NsysLog | None, progress: Callable[[str], None] | None) \
        -> tuple[Path | None, Path | None, bool, str | None]:
    """(the report, the raw capture left, imported by us, why there is no report) for one stem."""
    if interrupts.stopping():  # told to stop: the ranks' imports still queued do not start
        return None, None, False, None
    rep_path, qd_path = with_suffix(stem, ".nsys-rep"), with_suffix(stem, ".qdstrm")
    qdstrm = qd_path if qd_path.exists() else None
    if rep_path.exists() and rep_path.stat().st_size > 0:
        return rep_path, qdstrm, False, None
    if qdstrm is None:
        return None, None, False, None
    try:
        return import_qdstrm(nsys, qdstrm, progress=progress, log=log), qdstrm, True, None
    except NsysFailedError as exc:
        return None, qdstrm, False, str(exc)
