"""SIGINT, SIGTERM and SIGHUP while nvtx-trace runs other programs: who gets them, and that nothing we started
outlives us.

Why: nsys runs in a process group of its own (a terminal's Ctrl-C must reach it once, through us: a second one
while it writes the report makes it drop the report), so nothing we started stops by itself when we are told
to. A ``Guard`` is held for every command (the CLI's own, ``stage`` empty: helpers ended, partial files
removed, one line), and ``run`` and ``try`` hold one of their own on top: its handlers are in place before nsys starts,
so no signal falls between starting nsys and handling it, and a SIGHUP (an ssh connection dropped) is handled
like SIGTERM. What a signal does depends on what runs:

- nsys is starting and has not started the program yet: nsys 2022.4 mishandles signals then (measured: it
  ignores a SIGINT 0.35 s after its start and lets the program run to its end, exits 1 with "No transition in
  ...Shutdown" at 0.4-0.5 s, dies at once before 0.3 s leaving its agent), so nsys and all it started are
  ended at once: nothing was captured;
- the program runs: the first signal goes to nsys (SIGHUP as SIGTERM), which stops the program and writes the
  report; a program still running ``grace_s()`` later is ended (SIGTERM, then SIGKILL), the capture kept;
  a second signal is only noted; the third ends nsys and everything it started;
- anything else (before nsys starts, importing, exporting, analyzing, writing): our own children (nsys export,
  QdstrmImporter, pool workers, a timed program) are ended and ``Interrupted`` is raised, for the command to
  say in one line what was kept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from nvtx_trace.capture import nsys_files
from nvtx_trace.capture.processes import Watch, alive, descendants, live_processes, name_of, of_nsys

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_ENV = "NVTX_TRACE_STOP_GRACE_S"
DEFAULT_GRACE_S = 20.0  # the program's time to stop after nsys passed it the signal (a scheduler's KillWait is 30 s)
KILL_AFTER_S = 3.0  # between SIGTERM and SIGKILL when we end processes ourselves
GONE_WITHIN_S = 3.0  # after SIGKILL: how long a command waits for what it ended to be gone

Notice = Callable[[str], None]


def env_seconds(name: str, default: float, zero_allowed: bool = True) -> float:
    """Seconds from ``$name``; ``default`` where it is unset, unreadable or out of range."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 or (zero_allowed and value == 0) else default


def grace_s() -> float:
    """``$NVTX_TRACE_STOP_GRACE_S`` (seconds), else DEFAULT_GRACE_S."""
    return env_seconds(GRACE_ENV, DEFAULT_GRACE_S)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(BaseException):
    """nvtx-trace was told to stop: the command ends with 128 + the signal's number and one line, ``str()``:
    when, and what was kept (``kept``, filled in by whoever knows: the command that finishes the work)."""

    def __init__(self, signum: int, stage: str = "", kept: str = ""):
        super().__init__(signum)
        self.signum, self.stage, self.kept = signum, stage, kept

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        if not (self.stage or self.kept):  # a command that captures nothing (analyze, diff, ...)
            return f"interrupted ({signal_name(self.signum)})"
        when = f" {self.stage}" if self.stage else ""
        return f"interrupted ({signal_name(self.signum)}){when}: {self.kept or 'nothing was captured'}"


def end(pids, kill_after: float = KILL_AFTER_S, gone_within: float = GONE_WITHIN_S, with_groups: bool = False) -> None:
    """SIGTERM to each, then SIGKILL to those still running ``kill_after`` seconds later; then wait (at most
    ``gone_within`` seconds) until they are gone, so that nothing of ours outlives us. With ``with_groups``, the
    process groups they belong to, other than ours, get the same signals: a DataLoader worker forked after
    ``pids`` was read is in its program's group, and would otherwise run on, orphaned, until it noticed (5 s)."""
    pids = [p for p in pids if p != os.getpid()]
    groups = _groups_of(pids) if with_groups else set()
    send(pids, signal.SIGTERM)
    _send_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + kill_after
    while _running(pids, groups) and time.monotonic() < deadline:
        time.sleep(0.05)
    send([p for p in pids if alive(p)], signal.SIGKILL)
    _send_groups(groups, signal.SIGKILL)
    deadline = time.monotonic() + gone_within
    while _running(pids, groups) and time.monotonic() < deadline:  # a large program takes a moment to unmap
        time.sleep(0.05)


def _groups_of(pids) -> set[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:  # gone already
            continue
    return groups - {0, 1, os.getpgrp()}


def _send_groups(groups: set[int], signum: int) -> None:
    for group in groups:
        try:
            os.killpg(group, signum)
        except OSError:  # gone already
            pass


def _running(pids, groups: set[int]) -> bool:
    return any(alive(p) for p in pids) or bool(groups and any(g in groups for _, _, g in live_processes()))


def end_now(watch: Watch) -> None:
    """Kill what ``watch.root`` started, at once: its group is stopped first (SIGSTOP), so that nothing new is
    started while its tree is read, then everything seen is killed."""
    try:
        os.killpg(watch.root, signal.SIGSTOP)
    except OSError:
        pass
    watch.look()
    send([watch.root, *watch.still_running()], signal.SIGKILL)


def send(pids, signum: int) -> None:
    """``signum`` to each pid still there (one gone already is no error)."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:  # gone already
            pass


def _quiet_hung_terminal() -> None:
    """After a hangup our terminal is gone (writes fail with EIO): stdout and stderr go to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                os.dup2(devnull, fd)
        except OSError:
            pass
    os.close(devnull)


class Capture:
    """nsys (or the launcher nsys runs in) while it runs: see the module's docstring. ``started``: set once nsys
    has started the program (None: not known, e.g. behind a launcher, which handles signals itself)."""

    def __init__(self, proc: subprocess.Popen, started: threading.Event | None, notice: Notice | None):
        self.proc, self.started, self.notice = proc, started, notice
        self.configs = nsys_files.Named()  # nsys's injection configs for what it started: ours to remove
        self.watch = Watch(proc.pid, on_look=self.configs, eager=self._configs_unread)
        self.watch.start()
        self.count = 0
        self.first: int | None = None  # the signal passed to nsys
        self.aborted: int | None = None  # the signal that ended nsys before the program started
        self.late: int | None = None  # a signal that came when nsys had just ended: handled after it
        self.abandoned = False  # the third signal: nsys and all it started were killed, the report with them
        self.forwarded_at: float | None = None
        self.escalated = 0  # 1: the program was sent SIGTERM, 2: SIGKILL

    def _configs_unread(self) -> bool:
        """Some nsys session (a launcher's rank's, which may start late and last half a second) has a program
        whose configs were not read yet: the watch looks often until each has been."""
        return len(self.configs.given) < max(1, len(self.watch.sessions))

    def handle(self, signum: int) -> None:
        if self.proc.poll() is not None:
            self.late = self.late or signum
            return
        if self.aborted is not None:
            return
        self.count += 1
        if self.count == 1:
            self.first = signum
            if self.started is not None and not self.started.is_set():
                self.aborted = signum
                end_now(self.watch)
                return
            self.watch.look()  # what runs now, before nsys's launcher goes and the program is handed to init
            self.proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            self.forwarded_at = time.monotonic()
            self._say("Stopping the program; nsys is writing the report…")
        elif self.count == 2:
            self._say("Still writing the report; interrupt again to abandon it")
        else:
            self.abandoned = True
            end_now(self.watch)

    def _say(self, message: str) -> None:
        """A progress line from the signal handler: never an error of its own (the main thread may have been
        writing to the same stream: a reentrant write raises RuntimeError)."""
        if self.notice is None:
            return
        try:
            self.notice(message)
        except (RuntimeError, OSError, ValueError):
            pass

    def program(self) -> list[int]:
        """What nsys started that still runs, nsys's own processes (its launcher, tee, agent, importer) left
        out: what a signal's grace ends."""
        return [p for p in self.busy() if not of_nsys(name_of(p))]

    def busy(self) -> list[int]:
        """The program and nsys's importer, while either runs: nsys is not stuck while they work (an import
        may write nothing watched for minutes)."""
        return [p for p in self.watch.still_running(but=(self.proc.pid,)) if not name_of(p).startswith("nsys")]

    def escalate_if_due(self) -> None:
        """Called while waiting for nsys: a program that outlived the signal nsys passed it by ``grace_s()`` is
        sent SIGTERM, KILL_AFTER_S later SIGKILL (nsys has written the capture by then; it waits for the
        program)."""
        if self.forwarded_at is None or self.escalated >= 2:
            return
        waited = time.monotonic() - self.forwarded_at
        grace = grace_s()
        if waited < grace + (KILL_AFTER_S if self.escalated else 0):
            return
        self.watch.look()
        targets = self.program()
        if targets and not self.escalated:
            self._say(f"The program did not stop within {grace:.0f} s of the signal; ending it")
        send(targets, signal.SIGKILL if self.escalated else signal.SIGTERM)
        self.escalated += 1

    def sweep(self) -> None:
        """After nsys ended, when we were told to stop: whatever it started that still runs is ended, the program
        once the grace since the signal nsys passed it is over (nsys may end before the program does)."""
        self.watch.stop()
        left = self.watch.still_running(but=(self.proc.pid,))
        if left and self.forwarded_at is not None and not self.escalated:
            due = self.forwarded_at + grace_s()
            while left and time.monotonic() < due:
                time.sleep(0.1)
                left = [p for p in left if alive(p)]
            left = self.watch.still_running(but=(self.proc.pid,))
            if left:
                self._say(f"The program did not stop within {grace_s():.0f} s of the signal; ending it")
        if left:
            end(left)


class Guard:
    """The handlers of SIGINT, SIGTERM and SIGHUP for the length of a command (main thread only; elsewhere
    a no-op). ``stage`` says, in words, what is under way (for ``Interrupted``)."""

    def __init__(self, notice: Notice | None = None, stage: str = "before nsys started"):
        self.notice = notice
        self.stage = stage
        self.staged = bool(stage)  # the CLI's own guard keeps none: doctor's probe is not "importing the capture"
        self.received: list[int] = []
        self.capture: Capture | None = None
        self.spawning = False
        self.pending: list[int] = []
        self.stopping = False
        self.forwarded: list[subprocess.Popen] = []  # children with a guard of their own: they get our signal
        self.watches: list[Watch] = []  # what each nsys started (found by ``stop`` once nsys has ended)
        self._saved: dict = {}
        self._outer: Guard | None = None

    def __enter__(self) -> "Guard":
        global _active
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        self._outer, _active = _active, self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        _active = self._outer

    def _handle(self, signum, _frame) -> None:
        self.received.append(signum)
        if signum == signal.SIGHUP:
            _quiet_hung_terminal()
        if self.capture is not None:
            self.capture.handle(signum)
            return
        if self.spawning:  # nsys is being started: dealt with once it is (``start_capture``)
            self.pending.append(signum)
            return
        self.stop(signum)

    def stop(self, signum: int) -> None:
        """End our children (those with a guard of their own get the signal instead, every time: a third Ctrl-C
        abandons their report) and raise Interrupted, once."""
        spared = set()
        for child in self.forwarded:
            spared |= {child.pid, *descendants(child.pid)}
            try:
                child.send_signal(signum)
            except OSError:
                pass
        if self.stopping:
            return
        self.stopping = True
        left = {p for watch in self.watches for p in watch.still_running()}  # what nsys started, nsys gone
        end([p for p in {*descendants(os.getpid()), *left} if p not in spared], with_groups=True)
        raise Interrupted(signum, self.stage)

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Around starting nsys: a signal now waits until nsys is known (``start_capture``), or, when it could
        not start, stops the command as usual."""
        self.spawning = True
        try:
            yield
        finally:
            self.spawning = False
            if self.capture is None and self.pending:
                self.stop(self.pending.pop(0))

    def start_capture(self, proc: subprocess.Popen, started: threading.Event | None) -> Capture:
        capture = Capture(proc, started, self.notice)
        self.capture = capture
        self.watches.append(capture.watch)
        self.spawning = False
        pending, self.pending = self.pending, []
        for signum in pending:
            capture.handle(signum)
        return capture

    def end_capture(self) -> None:
        self.capture = None


_active: Guard | None = None


def active() -> Guard | None:
    return _active


def stage(words: str) -> None:
    """What is under way, for the line an interruption prints (no-op without a guard that says stages)."""
    if _active is not None and _active.staged:
        _active.stage = words


def stopping() -> bool:
    """True once the command was told to stop: start nothing new."""
    return _active is not None and _active.stopping


@contextmanager
def guarded(notice: Notice | None = None) -> Iterator[Guard]:
    """The active guard, or a new one for the length of the block (``profile`` called as a library)."""
    if _active is not None:
        yield _active
        return
    with Guard(notice) as guard:
        yield guard


@contextmanager
def forwarding(proc: subprocess.Popen, wait_s: float = 300.0) -> Iterator[None]:
    """A child that handles signals itself (another nvtx-trace): our signal is passed to it, and on the way
    out we wait for it to finish doing so (at most ``wait_s``, then it is killed)."""
    guard = _active
    if guard is not None:
        guard.forwarded.append(proc)
    try:
        yield
    finally:
        if guard is not None:
            guard.forwarded.remove(proc)
        if proc.poll() is None:
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                end([proc.pid, *descendants(proc.pid)])
                proc.wait()
