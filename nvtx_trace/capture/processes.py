"""Which processes are alive, read from /proc: what nsys left running when it died, and what a process
started, remembered while it runs (``Watch``)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable


def _stat(entry: Path) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm)": state ppid pgrp session ... (starttime is [19])."""
    named = _named_stat(entry)
    return named[1] if named else None


def _named_stat(entry: Path) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of /proc/PID/stat, in one read."""
    try:
        head, tail = (entry / "stat").read_text().rsplit(")", 1)
        return head.split("(", 1)[1], tail.split()
    except (OSError, IndexError):
        return None


def live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process (Linux /proc; [] elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry)
        try:
            if fields and fields[0] != "Z":
                found.append((int(entry.name), int(fields[1]), int(fields[2])))
        except (IndexError, ValueError):
            continue
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``: what nsys left running."""
    return sorted(pid for pid, _, group in live_processes() if group == pgid)


def descendants(pid: int) -> list[int]:
    """Live processes started by ``pid``, however deep, whatever their session (torchrun starts each rank in
    a session of its own, so killing torchrun's group leaves them running)."""
    children: dict[int, list[int]] = {}
    for child, parent, _ in live_processes():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return sorted(found)


def started_at(pid: int) -> int | None:
    """When a live process started (clock ticks since boot): a pid seen earlier is the same process only if
    this is unchanged. None when it is gone (or a zombie)."""
    fields = _stat(Path("/proc") / str(pid))
    if not fields or fields[0] == "Z":
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (``os.kill(pid, 0)`` says yes to those)."""
    return started_at(pid) is not None


def agent_session(args: list[str]) -> str | None:
    """The session an ``nsys --start-agent`` helper serves, named after its nsys's pid (``profile-NAME-PID``):
    ``--session-name=NAME`` in nsys 2022.4, ``--session-name NAME`` in 2025.3; None for any other process."""
    if "--start-agent" not in args:
        return None
    for i, arg in enumerate(args):
        if arg.startswith("--session-name="):
            return arg.split("=", 1)[1]
        if arg == "--session-name" and i + 1 < len(args):
            return args[i + 1]
    return None


def of_nsys(name: str) -> bool:
    """A process of nsys's own: nsys, its launcher, agent and tee (``nsys*``), and the QdstrmImporter that an
    nsys installed with its importer runs once the program has ended (a long import is no program outliving
    a signal: ending it would lose the report)."""
    return name.startswith("nsys") or name == "QdstrmImporter"


def name_of(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


# Popen's keywords for a child in a process group of its own: a terminal's Ctrl-C reaches it only through us, and
# what it forks is ended with it by group
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}

EAGER_S, EAGER_EVERY_S = 30.0, 0.01  # how long, and how often, a launcher's first nsys is looked for
WANTED_EVERY_S = 0.1  # how often while ``eager`` says so: a program of half a second is seen


class Watch:
    """Everything ``root`` started, however deep and in whatever session, remembered while it runs.

    Why: once nsys has ended, what it started is no longer found through parents: nsys's launcher puts the
    program in a session of its own and the program is handed to init when the launcher goes; nsys's agent
    leaves for init at once. So the tree is read every ``every`` seconds while ``root`` lives, less often where
    reading /proc takes long (and on demand, ``look``); ``still_running`` gives what was seen and still runs,
    with the members of its process groups (DataLoader workers forked after the last look).
    """

    def __init__(self, root: int, every: float = 1.0, on_look: Callable[[int], None] | None = None,
                 eager: Callable[[], bool] = lambda: False):
        self.root, self.every = root, every
        self.on_look = on_look  # called with each live process at each look, while it runs (nsys_files.Named)
        self.eager = eager  # look often while this says so, in the first EAGER_S seconds (a short program)
        self.seen: dict[int, tuple[int, int]] = {}  # pid -> (start time, process group)
        # the nsys processes under root (a launcher's ranks'): their agents are named after them
        self.profilers: set[int] = set()
        # `nsys profile` itself (its child nsys-launcher, nsys-tee and agent are not): one per capture session,
        # each to start one program, seen a second or more before it does
        self.sessions: set[int] = set()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # a signal handler may look while the main thread is looking

    def look(self) -> None:
        """Add what ``root`` has started by now."""
        for pid in [self.root, *descendants(self.root)]:
            named = _named_stat(Path("/proc") / str(pid))
            try:
                if named and named[1][0] != "Z":
                    if self.on_look is not None:
                        try:
                            self.on_look(pid)
                        except Exception:  # noqa: BLE001 - a note of ours: never the end of the watch
                            pass
                    with self._lock:
                        self.seen.setdefault(pid, (int(named[1][19]), int(named[1][2])))
                        # a fork becomes nsys at its exec; so does a launcher that execs its one rank (`sh -c
                        # 'RANK=0 exec "$@"'`): the root itself is then that rank's nsys
                        if named[0].startswith("nsys") and pid not in self.profilers:
                            self.profilers.add(pid)
                            if named[0] == "nsys" and name_of(int(named[1][1])) != "nsys":
                                self.sessions.add(pid)
            except (IndexError, ValueError):
                continue

    @property
    def saw_rank(self) -> bool:
        """A launcher started a rank's nsys, which starts its program at once: the program may be shorter than
        the watch's period, its nsys outlives it; a launcher's own helpers are no rank."""
        return bool(self.profilers)

    def start(self) -> "Watch":
        eager_until = time.monotonic() + EAGER_S

        def every() -> float:
            # a launcher's rank whose nsys fails at once lives a fraction of a second: looked for often until one
            # is seen (its start-up fault is nsys's, not the program's), for the first EAGER_S seconds only
            if time.monotonic() > eager_until:
                return self.every
            return EAGER_EVERY_S if not self.profilers else WANTED_EVERY_S if self.eager() else self.every

        def loop() -> None:
            pause = every()
            while not self._done.wait(pause):
                began = time.perf_counter()
                self.look()
                pause = max(every(), 20 * (time.perf_counter() - began))  # at most 5 % of a core on a busy host

        self.look()
        self._thread = threading.Thread(target=loop, daemon=True, name="nvtx-trace-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def still_running(self, but: tuple[int, ...] = ()) -> list[int]:
        """What was seen and still runs (the same process: same start time), and every live member of the
        process groups seen (other than ours), except the pids in ``but``."""
        ours = os.getpgrp()
        with self._lock:
            seen = dict(self.seen)
        groups = {group for _, group in seen.values()} - {0, 1, ours}
        found = {pid for pid, (start, _) in seen.items() if started_at(pid) == start}
        found |= {pid for pid, _, group in live_processes() if group in groups}
        return sorted(found - {os.getpid(), *but})
