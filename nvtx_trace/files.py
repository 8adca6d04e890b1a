"""Checks of every path a command will write, made before any work starts, and the one way files are written.

An output is never an input, whatever the form: the file itself (compared by device and inode, so hard
links and symlinks are caught, not by resolved path), a file the input is read through (the export beside a
``.nsys-rep``, the import of a ``.qdstrm``), or any file inside a folder given as input (a run folder is read
through its summary.json, report.sqlite or rank reports: writing one of them would change what it says). An
output is never a directory, never silently overwritten, and its folder must take a new file (tried, not
guessed from permissions: root may write anywhere but /proc or a read-only mount). A bad ``--json`` path is
one clear line at once, not a traceback after minutes of analysis; a write that fails later (a full disk) is
one line naming the output, and leaves the old file whole and no partial one.

Also the names of the files a capture leaves (nsys appends its suffixes to a stem itself). Below every layer
that writes or names a file (errors is all it imports), so capture, analyzer, report and runner share it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from nvtx_trace.errors import OutputError, UsageError

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")

SOCKET_MAX = 107  # bytes of a Unix socket's path
SOCKET_TAIL = 32  # what Python's multiprocessing adds under TMPDIR for one: /pymp-XXXXXXXX/listener-XXXXXXXX


def socket_room(tmp: str | os.PathLike) -> int:
    """Bytes to spare for multiprocessing's sockets under ``tmp``; below 0 a DataLoader worker cannot hand a batch
    over (``AF_UNIX path too long`` in its feeder thread, the batch dropped) and the program waits for ever."""
    return SOCKET_MAX - SOCKET_TAIL - len(os.fsencode(tmp))


def deep_tmp_note(env) -> str | None:
    """A warning for a program whose TMPDIR (in ``env``) leaves its DataLoader workers no room, with or without us:
    under the tool it looked like a hung capture."""
    tmp = os.path.abspath(env["TMPDIR"]) if env.get("TMPDIR") else ""  # as tempfile reads it
    if not tmp or not os.path.isdir(tmp) or socket_room(tmp) >= 0:
        return None
    return (f"TMPDIR is {len(os.fsencode(tmp))} bytes long ({tmp}): the sockets Python's multiprocessing makes "
            f"under it pass a Unix socket path's {SOCKET_MAX} bytes, so DataLoader workers cannot hand over a batch "
            f"('AF_UNIX path too long') and the program waits for ever, with or without nvtx-trace; use a TMPDIR "
            f"of at most {SOCKET_MAX - SOCKET_TAIL} bytes, e.g. TMPDIR=/tmp")


def stem_of(out: str | os.PathLike) -> Path:
    """``run.nsys-rep`` / ``run.qdstrm`` / ``run`` -> ``run``."""
    path = Path(out)
    for suffix in (*REPORT_SUFFIXES, ".qdstrm", ".sqlite"):
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)])
    return path


def variant_folder(label: str) -> str:
    """A tried variant's folder (``try``, ``tune``; the history names it): its knobs as written (``tf32=1``,
    ``num_workers=8,pin_memory=1``), file-name safe."""
    return "".join(c if c.isalnum() or c in "=,._-" else "_" for c in label)


def with_suffix(stem: Path, suffix: str) -> Path:
    """``stem`` + ``suffix`` (``Path.with_suffix`` would cut a dotted stem)."""
    return stem.with_name(stem.name + suffix)


def same_file(a, b) -> bool:
    """True when ``a`` and ``b`` are one file (hard links, symlinks, different spellings)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def same_path(a, b) -> bool:
    """One file, or one path where neither exists yet (both spelled out: ``./o`` is ``o``)."""
    if same_file(a, b):
        return True
    return any(x == y for x in _spellings(a) for y in _spellings(b))


def _spellings(path) -> set[str]:
    """The absolute spellings of ``path``: as written, and with its symlinks followed."""
    try:
        return {os.path.abspath(path), os.path.realpath(path)}
    except (OSError, ValueError):
        return {os.path.abspath(path)}


def inside(path, folder) -> bool:
    """True when ``path`` lies in ``folder`` at any depth, by any spelling (a symlinked folder included; a folder
    not made yet by its path)."""
    for spelling in _spellings(path):
        if any(spelling.startswith(f.rstrip(os.sep) + os.sep) for f in _spellings(folder)):
            return True
    if not os.path.isdir(folder):
        return False
    for spelling in _spellings(path):
        parent = os.path.dirname(spelling)
        while True:
            if same_file(parent, folder):
                return True
            up = os.path.dirname(parent)
            if up == parent:
                break
            parent = up
    return False


def read_through(source: Path) -> list[Path]:
    """The files reading ``source`` uses or makes beside it: a report's export, a raw capture's import, an
    SQLite file's journal. Writing an output over one of them would change what the input says."""

    name = source.name
    if name.endswith((".nsys-rep", ".qdrep")):
        return [with_suffix(stem_of(source), ".sqlite")]
    if name.endswith(".qdstrm"):
        return [with_suffix(stem_of(source), ".nsys-rep"), with_suffix(stem_of(source), ".sqlite")]
    if name.endswith(".sqlite"):
        return [source.with_name(name + tail) for tail in ("-wal", "-shm", "-journal")]
    return []


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


REPORT_NAMES = (".sqlite", ".nsys-rep", ".qdrep", ".qdstrm", ".xz", ".gz", ".zst")


def check_not_an_input(out: Path, inputs) -> None:
    """UsageError (one line) when writing ``out`` would change an input: the input itself, a file it is read
    through, or anything inside an input folder."""
    for source in inputs:
        source = Path(source)
        if same_file(out, source):
            what = "input report" if source.name.endswith(REPORT_NAMES) else "input"
            raise UsageError(f"{out} is the {what} {source} (the same file); choose another output path")
        if source.is_dir():
            if inside(out, source):
                raise UsageError(f"{out} is inside {source}, a folder given as input (what it holds is what is "
                                 "read); write the output elsewhere")
            continue
        for used in read_through(source):
            if same_path(out, used):
                raise UsageError(f"{out} is {used.name}, which the input {source} is read through; "
                                 "choose another output path")


def check_json_html(json_out, html_out) -> None:
    """The --json and --html paths as given: not empty; '-' (stdout) for the JSON only."""
    for flag, value in (("--json", json_out), ("--html", html_out)):
        if value is not None and not str(value).strip():
            raise UsageError(f"{flag} was given an empty path; give a file path" + (" or '-'" if flag == "--json"
                                                                                     else ""))
    if html_out is not None and str(html_out) == "-":
        raise UsageError("--html - : the HTML page is written to a file; give a path (only --json takes '-' for "
                         "stdout)")


def check_outputs(outputs: list[Path], inputs: list[Path], force: bool) -> None:
    """UsageError (one line) for the first output path that cannot or must not be written."""
    for i, out in enumerate(outputs):
        try:
            _check_output(out, outputs[:i], inputs, force)
        except OSError as exc:  # a name too long, a loop of links, a folder we may not search: said, not raised
            raise UsageError(f"{out}: {_reason(exc)}; choose another output path") from None


def _check_output(out: Path, before: list[Path], inputs: list[Path], force: bool) -> None:
    """One output path: not an input, not another output, a regular file or none, in a folder that takes files."""
    for other in before:
        if same_path(out, other):
            raise UsageError(f"{other} and {out} are the same file; give each output its own path")
    check_not_an_input(out, inputs)
    problem = describe_unreadable(out)
    if problem:
        raise UsageError(f"{out} {problem}; choose another output path")
    if out.is_dir():
        raise UsageError(f"{out} is a directory; give a file path for the output")
    odd = _not_a_regular_file(out)
    if odd:
        raise UsageError(f"{out} is {odd}: nvtx-trace writes outputs as regular files and replaces nothing else, "
                         f"--force included; give a file path" + (" (--json - writes to stdout)"
                                                                  if "stdout" in str(out) else ""))
    if out.exists() and not force:
        raise UsageError(f"{out} already exists; pass --force to overwrite it")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.exists():
        raise UsageError(f"{parent} does not exist; create it first")
    if not parent.is_dir():
        raise UsageError(f"{parent} is a file, not a folder; choose another output path")
    check_takes_files(parent, "choose another output path")


def _not_a_regular_file(out: Path) -> str:
    """What ``out`` is when it is there and not a regular file (writing it would replace a device, a FIFO or a
    link with a file: /dev/null made a regular file breaks the machine), else ''."""
    import stat

    try:
        mode = os.lstat(out).st_mode
    except OSError:
        return ""
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(out)})"
    if stat.S_ISREG(mode):
        return ""
    return ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode) else
            "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")


def check_takes_files(folder: Path, what_to_do: str) -> None:
    """A folder must take a new file: permissions say too little (root passes them for /proc and read-only
    mounts), so a hidden file is made there and removed."""
    if not os.access(folder, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only(folder) else "is not writable"
        raise UsageError(f"{folder} {why}; {what_to_do}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".nvtx-trace-probe-", dir=folder)
    except OSError as exc:
        raise UsageError(f"{folder} cannot take new files ({_reason(exc)}); {what_to_do}") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _reason(exc: OSError) -> str:
    """An OSError in words, with what to do where that is plain (a full disk, a size limit)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full (free some space)"
    if exc.errno == errno.EFBIG:
        return "the file-size limit was reached (ulimit -f)"
    if exc.errno == errno.EROFS:
        return "a read-only file system"
    if exc.errno == errno.ENOENT:
        return "this file system takes no new files"
    return exc.strerror or str(exc)


def cannot_write(path, exc: OSError) -> OutputError:
    """The one line for an output that could not be written: it names the output, not the input."""
    return OutputError(f"cannot write {path}: {_reason(exc)}; nothing was written there, choose another path")


def make_folder(folder: Path) -> None:
    """A folder of the outputs, made now; a disk that refuses it is one line naming it."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise cannot_write(folder, exc) from None


def file_digest(path: Path) -> str:
    """What a file holds, to say afterwards that nvtx-trace left it as it was (try and tune hash the script)."""
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_atomically(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it and a rename: a reader, or a second
    writer of the same file, never sees half of it, and an interrupted or failed write (a full disk) leaves
    the old file whole and no temporary one; a failure is an OutputError (one line)."""
    path = Path(path)
    tmp = None
    try:
        # named after the file where that fits the folder's name limit (a legal 255-byte name has no room for
        # ".NAME.xxxxxxxx.tmp": the analysis was lost after it ran)
        prefix = f".{path.name}." if len(os.fsencode(path.name)) <= 200 else ".nvtx-trace-"
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent or ".")
        os.fchmod(fd, 0o666 & ~_umask())  # the mode a plain open() would give, not mkstemp's 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise cannot_write(path, exc) from None
    except BaseException:
        _remove(tmp)
        raise


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for other threads meanwhile)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove(path) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


LOCK_NAME = ".nvtx-trace-run.lock"
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


class FolderClaim:
    """One run's hold on its folder: a second run into it while the first is alive is refused (one line), not
    interleaved; a lock left by a run that died is taken over.

    Why the lock holds our pid from its birth (written to a private file, then linked into place): a signal
    (raised as an exception in the main thread, whichever thread received it) may land anywhere in ``take``;
    ``release`` removes whatever of ours is there, so no lock is ever left in the user's folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.lock = self.folder / LOCK_NAME
        self._mine = self.folder / f"{LOCK_NAME}.{os.getpid()}"
        self.held = False
        self._in_place = False  # creating the lock in place: until it holds our pid, an empty lock is ours

    def take(self) -> None:
        for _attempt in range(2):
            try:
                self._mine.write_text(str(os.getpid()))
                os.link(self._mine, self.lock)
            except FileExistsError:
                pass
            except OSError as exc:
                if exc.errno not in NO_HARD_LINKS:
                    raise
                if self._create_in_place():
                    return
            else:
                self.held = True
                return
            finally:
                self._mine.unlink(missing_ok=True)
            pid = _pid_in(self.lock)
            if pid > 0 and pid != os.getpid() and _alive(pid):
                raise UsageError(f"{self.folder} is being written by another nvtx-trace run (pid {pid}); "
                                 "choose another --out") from None
            self.lock.unlink(missing_ok=True)  # stale: its run is gone
        raise UsageError(f"{self.folder} is being claimed by another nvtx-trace run; choose another --out")

    def _create_in_place(self) -> bool:
        """Where the file system has no hard links: the lock is made, then given our pid."""
        self._in_place = True
        try:
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            self._in_place = False
            return False
        self.held = True
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        return True

    def release(self) -> None:
        """Also after a ``take`` cut short: the lock goes if it is ours (it names our pid), never another's."""
        self._mine.unlink(missing_ok=True)
        pid = _pid_in(self.lock)
        if self.held or pid == os.getpid() or (self._in_place and pid == 0 and self.lock.exists()):
            self.lock.unlink(missing_ok=True)
        self.held = self._in_place = False


def _pid_in(lock: Path) -> int:
    try:
        return int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return 0


def check_unclaimed(folder: Path) -> None:
    """Refuse, before anything starts, a folder another live run is writing."""
    pid = _pid_in(Path(folder) / LOCK_NAME)
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
    check_takes_files(probe, f"the outputs cannot go to {folder}; choose another --out")
