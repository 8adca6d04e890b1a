"""What nsys leaves in the temporary folders when it, or the program it injected, is ended before its own
clean-up: the injection configs it writes to /tmp for the program (named in the program's environment, one
QUADD_*_CONFIG each: injection, CUDA, OS runtime, ...), its termination-status files, and in /dev/shm the shared
memory and semaphores named after its processes. nvtx-trace removes those of the nsys it ran, once nothing alive
still names them; the watchdog (_watchdog.py) does the same after a SIGKILL.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from nvtx_trace.capture.processes import alive

CONFIG_RE = re.compile(r"^injection_config_[0-9a-f]{8}$")
CONFIG_VAR_RE = re.compile(rb"^QUADD_\w*CONFIG=(.*/injection_config_[0-9a-f]{8})$")  # each trace has its own
# named after a process of the capture, removed by nsys as it ends: an agent's instance, the program's semaphore
# (nsys 2022.4: sem.nsys_sem_PID), a process waiter's (2025.3: sem.NSys-process_waiter-PID-PIDNS-VERSION)
SHM_NAMES = ("quadd-agent-instance-{pid}", "sem.nsys_sem_{pid}", "sem.NSys-process_waiter-{pid}-*")
TERMINATION_STATUS = "nsys_termination_status_"  # + the pid of a process of the capture (its launcher's, a rank's)


def termination_status_pid(name: str) -> str | None:
    """The pid a termination-status file is named after; None for any other file."""
    return name.rsplit("_", 1)[-1] if name.startswith(TERMINATION_STATUS) else None


def environ_of(pid) -> list[bytes]:
    """A process's environment as ``NAME=value`` items (none where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read().split(b"\0")
    except OSError:
        return []


def configs_in(env: list[bytes]) -> set[str]:
    """The injection configs an environment (``environ_of``) names."""
    return {m.group(1).decode("utf-8", "replace") for m in map(CONFIG_VAR_RE.match, env) if m}


def configs_named_by(pid) -> set[str]:
    return configs_in(environ_of(pid))


def in_use() -> set[str]:
    """Injection configs some live process still names (another nsys's program, still running)."""
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")) if os.path.isdir("/proc") else ():
        used |= configs_named_by(pid)
    return used


class Named:
    """The injection configs the processes of one capture were given, read while they run (processes.Watch's
    ``on_look``): only those are ours to remove. Another nsys's, made meanwhile, are not, even one no process
    names yet (its nsys writes it before it starts its program)."""

    def __init__(self):
        self.given: set[frozenset[str]] = set()  # one set per program nsys started (its workers inherit it)
        # processes that named theirs; one that named none is read again (a fork, before its exec)
        self._read: set[int] = set()

    @property
    def paths(self) -> set[str]:
        return set().union(*tuple(self.given))  # tuple() in one step: the watch's thread may be adding

    def __call__(self, pid: int) -> None:
        if pid not in self._read:
            found = configs_named_by(pid)
            if found:
                self.given.add(frozenset(found))
                self._read.add(pid)


def remove_leftovers(nsys_pids, since: float, folders=(), named: set[str] | None = None) -> list[Path]:
    """Remove the injection configs ``named`` (``Named.paths``; None: every one made since ``since``, epoch
    seconds) that no live process names, and in /tmp and ``folders`` the termination-status files of
    ``nsys_pids`` or of processes that ended since; returns what was removed."""
    removed = []
    try:
        configs = [p for p in Path("/tmp").iterdir() if CONFIG_RE.match(p.name)
                   and (named is None or str(p) in named)]
    except OSError:
        configs = []
    used = in_use() if configs else set()
    for path in configs:
        try:
            if (named is not None or path.stat().st_mtime >= since - 1) and str(path) not in used:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    for folder in {"/tmp", *map(str, filter(None, folders))}:
        try:
            found = list(Path(folder).glob(f"{TERMINATION_STATUS}*"))
        except OSError:
            continue
        for path in found:  # removed once its process ended
            pid = termination_status_pid(path.name)
            try:
                mine = int(pid) in nsys_pids or (path.stat().st_mtime >= since - 1 and not alive(int(pid)))
                if mine:
                    path.unlink()
                    removed.append(path)
            except (OSError, ValueError):
                continue
    return removed


def remove_shared_memory(pids, shm: str = "/dev/shm") -> list[Path]:
    """Remove what nsys keeps in /dev/shm for these processes (a capture's, its agents') once they have ended:
    a SIGKILL of nsys leaves it, and the tmpfs keeps it until the machine restarts."""
    removed = []
    for pid in pids:
        if alive(pid):
            continue
        for pattern in SHM_NAMES:
            for path in Path(shm).glob(pattern.format(pid=pid)):
                try:
                    path.unlink()
                    removed.append(path)
                except OSError:
                    continue
    return removed
