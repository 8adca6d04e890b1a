"""``nsys profile``: the one builder of its command line, and running it.

Success is judged by the files, not nsys's exit code (a run whose importer is missing exits
0 and leaves only a ``.qdstrm``, which is imported here). A Ctrl-C reaches nsys once, through
us, and nothing nsys started outlives an interrupted run (``interrupts``). With a log, nsys's own
lines go to ``nsys.log`` and the program's output straight to our stdout/stderr (``own_output``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from nvtx_trace import names
from nvtx_trace.capture import interrupts, lifeline, nsys_files, own_output, stuck
from nvtx_trace.capture.locate import Nsys
from nvtx_trace.capture.nsys_log import NsysLog, bar_label, pump, tail
from nvtx_trace.capture.nsys_reports import (
    MAX_PARALLEL_IMPORTS,
    collect,
    files_of,
    kept_raw,
    make_scratch,
    missing_ranks,
    no_space,
    raw_captures,
    remove_scratch,
    stems_written,
)
from nvtx_trace.capture.processes import OWN_GROUP, agent_session, started_at
from nvtx_trace.capture.torchrun import RANK_FIELD
from nvtx_trace.errors import NsysFailedError
from nvtx_trace.files import stem_of, with_suffix

Progress = Callable[[str], None]

# nsys's own lines (2022.4 to 2025.x), told apart from the program's only when both come mixed
# through nsys (own_output.FALLBACK_MARKER): they go to the log, everything else to the terminal.
NSYS_LINES = re.compile(
    r"^(Generating '|Generated:|\s+/\S+\.(qdstrm|nsys-rep|qdrep|sqlite)$|Importer error status|"
    r"Unable to retrieve the importer version|Collecting data\.\.\.|Processing events\.\.\.|"
    r"Saving temporary |Creating final output files|Capture range (started|ended)|"
    r"The target application terminated|The application terminated before|Process is terminated|"
    r"Waiting for termination of re-parented|Use the `--wait` option|Report file (moved|saved)|"
    r"WARNING: |Failed to create |\[\d+/\d+\] |" + re.escape(own_output.FALLBACK_MARKER) + ")"
)


@dataclass
class ProfileResult:
    """What one ``nsys profile`` left behind. ``rep`` is None when no report could be made."""

    returncode: int
    rep: Path | None
    qdstrm: Path | None
    log: str = ""  # nsys's output, only when captured (capture_output=True)
    interrupted: bool = False  # we were told to stop (SIGINT, SIGTERM, SIGHUP) while nsys ran
    signal: int | None = None  # which signal
    aborted: bool = False  # ... before nsys had started the program: nsys and all it started were ended
    abandoned: bool = False  # ... three times: nsys and all it started were killed, the report with them
    left_running: list[int] = field(default_factory=list)  # what nsys started and still runs (nsys was killed)
    imported_by_us: bool = False  # nsys could not import the .qdstrm; we ran QdstrmImporter
    problem: str | None = None  # why there is no report
    stuck: bool = False  # nsys made no progress after the program ended and was ended (``stuck``)
    pid: int | None = None  # nsys's pid, also the process group of the program it started
    reports: list[Path] = field(default_factory=list)  # every report written: ``rep``, or one per rank
    program_started: bool | None = None  # did nsys start the program (None: not known, e.g. behind a launcher)

    @property
    def never_started(self) -> bool:
        """nsys failed before it started the program (its fault: the program did not run)."""
        return self.program_started is False and self.rep is None and not self.interrupted

    def require_report(self) -> Path:
        """The ``.nsys-rep``, or NsysFailedError saying why there is none."""
        if self.rep is None:
            raise NsysFailedError(self.problem or "nsys produced no report")
        return self.rep


def _end_agents(nsys_pids, since: int | None = None) -> None:
    """Stop the ``nsys --start-agent`` helpers that these nsys processes started, once they have ended (seen
    when nsys fails at start-up, "Local Endpoint is not available", or is killed). An agent's session is named
    after its nsys's pid; ``since``: when the first of them started (an older agent is another nsys's that
    had the same pid)."""
    marks = {str(pid) for pid in nsys_pids}
    for _attempt in range(3):  # an agent daemonizes in steps: a parent's end may reveal its child
        found = []
        for entry in Path("/proc").glob("[0-9]*") if os.path.isdir("/proc") else ():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            args = [w.decode("utf-8", "replace") for w in words if w]
            session = agent_session(args)
            if session is not None and session.rsplit("-", 1)[-1] in marks:
                pid = int(entry.name)
                born = started_at(pid)
                if born is not None and (since is None or born >= since):
                    found.append(pid)
        if not found:
            return
        interrupts.end(found, kill_after=2.0)
        nsys_files.remove_shared_memory(found)  # a killed agent's is left behind; the next agents see it


def profile_command(nsys: Nsys, stem, trace: Sequence[str], extra: Sequence[str], argv: Sequence[str],
                    own_output_python: str | None = None, launcher: Sequence[str] = ()) -> list[str]:
    """The one place the ``nsys profile`` command line is built (run prints it, profile runs it).

    With ``own_output_python``, the program is started through ``own_output`` by that interpreter (by
    path: it needs nothing but the standard library, and no module of the program's folder can shadow it).
    With a ``launcher`` (``torchrun ... --no-python``), nsys runs inside it, once per rank.
    """
    wrap = [own_output_python, own_output.__file__] if own_output_python else []
    return [*launcher, str(nsys.path), "profile", "-o", str(stem), "-f", "true", "-t", ",".join(trace), *extra,
            *wrap, *argv]


class _Sorter:
    """Sends nsys's pipes to the log; once the wrapper says the program's output is mixed in (it
    does so before the program starts), the lines that are not nsys's go on to our stdout/stderr."""

    def __init__(self, log: NsysLog, mixed: bool = False):
        self.log, self.mixed = log, mixed
        self._bar: tuple[str, str] | None = None  # a progress bar's latest state, written when it moves on
        self._lock = threading.Lock()

    def _to_log(self, line: str) -> None:
        """Into the log, each progress bar at its last state only (nsys redraws it dozens of times)."""
        label = bar_label(line.split("\r")[-1].rstrip("\n"))
        with self._lock:
            if self._bar is not None and self._bar[0] != label:
                self.log.write(self._bar[1])
                self._bar = None
            if label is not None:
                self._bar = (label, line)
                return
        self.log.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._bar is not None:
                self.log.write(self._bar[1])
                self._bar = None

    def sink(self, ours):
        def take(line: str) -> None:
            self._to_log(line)
            if line.startswith(own_output.FALLBACK_MARKER):
                self.mixed = True
            elif self.mixed and not NSYS_LINES.match(line.split("\r")[-1]):
                try:
                    ours.write(line)
                    ours.flush()
                except (OSError, ValueError):  # our reader left (a closed pipe): the log still has it
                    pass
        return take


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
    log: NsysLog | None = None,
    progress: Progress | None = None,
    launcher: Sequence[str] = (),
    ranks: int | None = None,
) -> ProfileResult:
    """Run ``nsys profile -o out_stem -f true -t trace extra argv`` and make sure a report exists.

    Output: with ``capture_output`` everything lands in ``ProfileResult.log``; with ``log``,
    nsys's lines go to the log file and the program's to our stdout/stderr; otherwise both are
    inherited. Existing ``out_stem.nsys-rep`` / ``.qdstrm`` are replaced. When only a ``.qdstrm``
    appears, the matching QdstrmImporter is run here. With a ``launcher`` (torchrun), ``out_stem``
    holds ``%q{RANK}`` and every rank's report is collected (``ProfileResult.reports``); ``ranks``: how many
    should write one, when known (a rank that wrote none is named in ``problem``).
    """
    stem = Path(os.path.abspath(Path(cwd or ".") / stem_of(out_stem)))
    stem.parent.mkdir(parents=True, exist_ok=True)
    for stale in files_of(stem, (".nsys-rep", ".qdstrm")):
        stale.unlink(missing_ok=True)
    env = dict(os.environ if env is None else env)
    handover = scratch = born = None
    agents_ended = False
    if log is not None and not capture_output:
        try:
            handover = own_output.Handover()
            env[own_output.ENV] = handover.address
        except (OSError, AttributeError):  # no abstract Unix sockets here: nsys's stream is sorted instead
            handover = None
    cmd = profile_command(nsys, stem, trace, extra, argv, own_output_python=sys.executable if handover else None,
                          launcher=launcher)
    if log is not None:
        log.section("profile", cmd)
    pipe = subprocess.PIPE if (capture_output or log is not None) else None
    # nsys in a group of its own: a terminal's Ctrl-C reaches it once, through us (a second makes it drop the
    # report). The guard's handlers are in place before it starts: a signal while it starts waits for it.
    proc = capture = None
    began = time.time()
    try:
        with interrupts.guarded(progress) as guard:
            guard.notice = progress or guard.notice
            interrupts.stage("while nsys was starting")
            with guard.starting():
                if handover is not None:  # nsys's own temporary files (its raw capture while it records,
                    # /tmp/nsys-report-*) go to a folder of ours, removed when it ends, however it ended; made where
                    # a signal waits for nsys to start (a SIGTERM between the folder made and its name kept left
                    # it behind in a loaded pass); the program starts through own_output, which gives it the
                    # user's TMPDIR back
                    scratch = make_scratch(env)
                try:
                    proc = subprocess.Popen(
                        cmd, env=env, cwd=cwd, stdout=pipe, stderr=subprocess.STDOUT if capture_output else pipe,
                        text=pipe is not None, errors="replace" if pipe else None, **OWN_GROUP,
                    )
                except OSError as exc:
                    if handover is not None:
                        handover.close()
                    raise NsysFailedError(f"could not start {cmd[0]}: {exc}") from exc
                born = started_at(proc.pid)
                # killed with SIGKILL, we still take nsys, the program and our temporary folder with us, and the
                # window file the program writes its decisions to (read, then removed, after a run that ends)
                window = (env or {}).get(names.WINDOW_FILE_ENV)
                line = lifeline.tie(proc, [p for p in (scratch, window) if p])
                capture = guard.start_capture(proc, handover.started if handover is not None and not launcher
                                              else None)
            pumps = []
            if log is not None and not capture_output:
                # a launcher's own lines (torchrun's warnings, its failure report) are the user's to see
                sorter = _Sorter(log, mixed=handover is None or bool(launcher))
                pumps = [pump(proc.stdout, sorter.sink(sys.stdout)), pump(proc.stderr, sorter.sink(sys.stderr))]
            started = time.monotonic()
            finishing = stuck.Finishing(capture.busy, stem, time.time() - 1, progress,
                                        armed=(lambda: capture.watch.saw_rank) if launcher else (lambda: True),
                                        tmp=scratch)
            try:
                text = _drain(proc, capture, finishing) if capture_output else ""
                returncode = _wait(proc, capture, finishing)
            finally:
                guard.end_capture()
                capture.watch.stop()
            interrupts.stage("while nsys was ending")
            told = capture.first or capture.late  # we were told to stop: nothing nsys started may outlive us
            if told:
                capture.sweep()
            left = [] if told else capture.program()  # nsys killed by someone else: the program is left alone
            if handover is not None:
                handover.close()
            if progress and not capture.count and not capture.late and finishing.stuck_for is None:
                progress(f"Capture ended after {time.monotonic() - started:.1f} s")
            for thread in pumps:
                thread.join(timeout=5)  # a program left running (nsys killed) may hold nsys's pipes open
            if pumps:
                sorter.flush()
            if capture_output and log is not None:
                log.write(text)
            _end_agents({proc.pid, *(capture.watch.profilers if launcher else ())}, since=born)  # each rank's nsys's too
            agents_ended = True
            line.release()
            if capture.late and not capture.first:  # it came as nsys ended: the capture is whole, we stop now
                interrupts.stage("as nsys ended")
                guard.stop(capture.late)
    finally:
        if proc is not None:  # what nsys keeps in /tmp for the program, left when either was ended early
            rank_nsys = capture.watch.profilers if launcher and capture is not None else ()
            if not agents_ended:  # ended early (a signal as nsys started): its agent may still write in scratch
                _end_agents({proc.pid, *rank_nsys}, since=born)
            nsys_files.remove_leftovers({proc.pid, *rank_nsys}, since=began,
                                        folders=(env.get(own_output.TMPDIR_ENV), env.get("TMPDIR"), scratch),
                                        named=capture.configs.paths if capture is not None and
                                        capture.configs.paths else None)  # none seen: ended before the program
            nsys_files.remove_shared_memory({proc.pid, *rank_nsys, *(capture.watch.seen if capture is not None else ())})
        made = [p for p in files_of(stem, (".nsys-rep", ".qdstrm")) if p.exists() and p.stat().st_size > 0]
        raw = raw_captures(scratch) if scratch is not None and not made else []
        if scratch is not None and not raw:  # after nsys and its agent ended (or failed to start)
            remove_scratch(scratch)
    result = ProfileResult(returncode, None, None, text, interrupted=capture.first is not None, pid=proc.pid,
                           signal=capture.first, aborted=capture.aborted is not None, left_running=left,
                           abandoned=capture.abandoned, stuck=finishing.stuck_for is not None,
                           program_started=_program_started(handover, launcher, capture.watch))
    if raw and (result.stuck or result.aborted or result.interrupted or result.abandoned
                or result.program_started is False):
        shutil.rmtree(raw[0].parent, ignore_errors=True)  # halfway, or before the program: no capture to finish
        raw = []
    if result.stuck:
        for partial in finishing.leftovers():
            partial.unlink(missing_ok=True)
    if result.stuck and not launcher:  # what it left is no report (its raw capture stopped halfway)
        for partial in files_of(stem, (".nsys-rep", ".qdstrm")):
            partial.unlink(missing_ok=True)
        result.problem = finishing.problem()
        return result
    if result.aborted:  # ended before the program started: a half-written capture is no report
        for partial in files_of(stem, (".nsys-rep", ".qdstrm")):
            partial.unlink(missing_ok=True)
        result.problem = "nothing was captured: nsys had not started the program yet"
        return result
    interrupts.stage("while importing the capture")
    stems = stems_written(stem) if launcher else [stem]
    if len(stems) > 1 and progress:
        progress(f"{len(stems)} rank reports written")
    with ThreadPoolExecutor(max_workers=min(len(stems), MAX_PARALLEL_IMPORTS) or 1) as pool:
        collected = list(pool.map(lambda s: collect(nsys, s, log, progress if len(stems) == 1 else None), stems))
    for rep, qdstrm, imported, problem in collected:
        result.qdstrm = result.qdstrm or qdstrm
        result.imported_by_us |= imported
        if rep is not None:
            result.reports.append(rep)
        result.problem = result.problem or problem
    result.rep = result.reports[0] if result.reports else None
    if launcher and result.rep is not None:
        result.problem = result.problem or missing_ranks([stem_of(r) for r in result.reports], ranks)  # an empty file too
    if result.stuck:  # the other ranks' reports are kept and analyzed
        result.problem = ("; ".join(filter(None, [result.problem, finishing.problem(ranks=True)])) if stems
                          else finishing.problem())
    if (not stems and not result.stuck) or (result.rep is None and result.problem is None):
        full = no_space(log)
        said = "" if full else tail(text) if text else (log.tail() if log is not None else "")
        wrote = (f"no {stem.name.replace(RANK_FIELD, 'N')}.nsys-rep" if launcher
                 else f"neither {with_suffix(stem, '.nsys-rep').name} nor {with_suffix(stem, '.qdstrm').name}")
        result.problem = (
            f"{'the launcher' if launcher else 'nsys'} exited with status {returncode} and wrote {wrote}"
            + full + (f": {said}" if said else "") + (f" ({log.where()})" if log is not None else "")
            + kept_raw(raw, stem, full=bool(full))
        )
    elif raw and result.rep is None:
        result.problem = (result.problem or "") + kept_raw(raw, stem, full=bool(no_space(log)))
    elif raw:  # a report came after all (a rank's): the raw capture left beside it is no longer needed
        shutil.rmtree(raw[0].parent, ignore_errors=True)
    return result


def _program_started(handover, launcher, watch) -> bool | None:
    """Did nsys start the program: each program asks the handover for our output as it starts. Behind a launcher,
    known only once a rank's nsys was seen (a launcher can fail before it starts any)."""
    if handover is None or (launcher and not watch.saw_rank):
        return None
    return handover.started.is_set()


def _drain(proc: subprocess.Popen, capture: interrupts.Capture, finishing: stuck.Finishing) -> str:
    """Read captured output; a signal arriving mid-read must not stop the collection, nor a stuck nsys."""
    chunks: list[str] = []
    reader = threading.Thread(target=_read_all, args=(proc.stdout, chunks), daemon=True)
    reader.start()
    ended_at = None
    while reader.is_alive():
        reader.join(timeout=0.25)
        if proc.poll() is None:
            _look(proc, capture, finishing)
        elif ended_at is None:
            ended_at = time.monotonic()
        elif time.monotonic() - ended_at > PIPE_AFTER_EXIT_S:  # a process nsys left holds its pipe open
            break
    return "".join(chunks)


PIPE_AFTER_EXIT_S = 5.0


def _read_all(stream, chunks: list[str]) -> None:
    while True:
        try:
            chunk = stream.read()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for safety
            continue
        except (OSError, ValueError):
            return
        if not chunk:
            return
        chunks.append(chunk)


def _wait(proc: subprocess.Popen, capture: interrupts.Capture, finishing: stuck.Finishing) -> int:
    """nsys's exit status; meanwhile, a program that outlives the signal nsys passed it is ended, and an nsys
    that has stopped finishing its report is ended too (``stuck``)."""
    while True:
        try:
            return proc.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            _look(proc, capture, finishing)
        except KeyboardInterrupt:  # a handler installed elsewhere raised; keep waiting for the report
            continue


def _look(proc: subprocess.Popen, capture: interrupts.Capture, finishing: stuck.Finishing) -> None:
    capture.escalate_if_due()
    # also after a signal: a stuck nsys ignores the one passed to it (a SIGTERM from `timeout` would otherwise
    # leave the run waiting until a third)
    if capture.first is not None:  # told to stop: no minutes of waiting for an nsys that stopped finishing
        finishing.limit = min(finishing.limit, interrupts.grace_s() + interrupts.KILL_AFTER_S)
    if finishing.stuck_for is None and finishing.look():
        interrupts.end_now(capture.watch)
