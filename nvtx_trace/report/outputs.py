"""Checks of every path a command will write, made before any work starts.

An output is never the input (compared by device and inode, so hard links and
symlinks are caught, not by resolved path), never a directory, never silently
overwritten, and its folder must exist and be writable: a bad ``--json`` path
is one clear line at once, not a traceback after minutes of analysis.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from nvtx_trace.errors import UsageError


def same_file(a, b) -> bool:
    """True when ``a`` and ``b`` are one file (hard links, symlinks, different spellings)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def describe_unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be opened as an input, in words (symlink loop, dangling link), or None."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if os.path.islink(path):
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        return None
    return None


def check_outputs(outputs: list[Path], inputs: list[Path], force: bool) -> None:
    """UsageError (one line) for the first output path that cannot or must not be written."""
    for i, out in enumerate(outputs):
        for other in outputs[:i]:
            if same_file(out, other) or os.path.abspath(out) == os.path.abspath(other):
                raise UsageError(f"{other} and {out} are the same file; give each output its own path")
        for source in inputs:
            if same_file(out, source):
                raise UsageError(f"{out} is the input report {source} (the same file); choose another output path")
        problem = describe_unreadable(out)
        if problem:
            raise UsageError(f"{out} {problem}; choose another output path")
        if out.is_dir():
            raise UsageError(f"{out} is a directory; give a file path for the output")
        if out.exists() and not force:
            raise UsageError(f"{out} already exists; pass --force to overwrite it")
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.exists():
            raise UsageError(f"{parent} does not exist; create it first")
        if not parent.is_dir():
            raise UsageError(f"{parent} is a file, not a folder; choose another output path")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{parent} is not writable; choose another output path")


def write_atomically(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename: a reader, or a second
    writer of the same file, never sees half of it, and an interrupted write leaves the old file whole."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


LOCK_NAME = ".nvtx-trace-run.lock"


def claim_folder(folder: Path):
    """Take ``folder`` for one run: a second run into it while the first is alive is refused (one line),
    not interleaved. A lock left by a run that died is taken over. Returns the function that releases it."""
    lock = Path(folder) / LOCK_NAME
    for _attempt in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid > 0 and _alive(pid):
                raise UsageError(f"{folder} is being written by another nvtx-trace run (pid {pid}); "
                                 "choose another --out") from None
            lock.unlink(missing_ok=True)  # stale: its run is gone
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return lambda: lock.unlink(missing_ok=True)
    raise UsageError(f"{folder} is being claimed by another nvtx-trace run; choose another --out")


def check_unclaimed(folder: Path) -> None:
    """Refuse, before anything starts, a folder another live run is writing."""
    lock = Path(folder) / LOCK_NAME
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return
    if pid > 0 and pid != os.getpid() and _alive(pid):
        raise UsageError(f"{folder} is being written by another nvtx-trace run (pid {pid}); choose another --out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_folder_writable(folder: Path) -> None:
    """The folder, or the nearest existing folder above it, must be writable: found now, not after the run."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{probe} is a file, so {folder} cannot be created; choose another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{probe} is not writable, so the outputs cannot go to {folder}; choose another --out")
