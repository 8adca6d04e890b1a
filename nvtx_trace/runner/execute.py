"""Carrying out a plan: profile, then (even when the program failed or was interrupted) import,
export, analyze and write the summaries.

The run's folder is claimed for the whole run; nsys's own output goes to its ``nsys.log``.
Success is judged by the files, not by nsys's exit code; the program's exit code becomes ours.
Told to stop (``capture.interrupts.Interrupted``), a run says in one line what it kept and the command that
finishes it, and leaves no half-made file, no lock, and no folder when nothing was captured.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from nvtx_trace.capture import interrupts, leftovers
from nvtx_trace.capture.export import export_sqlite
from nvtx_trace.capture.nsys_log import NsysLog, tail
from nvtx_trace.capture.nsys_reports import MAX_PARALLEL_IMPORTS
from nvtx_trace.capture.profile import ProfileResult, profile
from nvtx_trace.errors import BadReportError, MissingDependencyError, NsysFailedError, NvtxTraceError, UsageError
from nvtx_trace.files import FolderClaim, cannot_write, stem_of, with_suffix, write_atomically
from nvtx_trace.runner import default_window
from nvtx_trace.runner.plan import REPORT_OUTPUTS, Plan, RunOptions, rank_outputs

Progress = Callable[[str], None]


@dataclass
class RunResult:
    plan: Plan
    exit_code: int  # the program's (130 after Ctrl-C when the program gave none)
    profile: ProfileResult | None = None
    sqlite: Path | None = None  # the (first) export
    sqlites: list[Path] = field(default_factory=list)  # every export: one, or one per rank (--per-rank)
    analysis: object | None = None  # nvtx_trace.analyzer.Analysis
    written: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # stages that failed, one line each
    error: NvtxTraceError | None = None  # the first stage failure, for the exit code when the program succeeded
    window: default_window.Outcome | None = None  # the default window: which steps were profiled and why
    oom: dict | None = None  # the program ran out of GPU memory: nvtx_autotrace's record of it (window file)


def execute(plan: Plan, progress: Progress | None = None) -> RunResult:
    """Profile, then (even when the program failed or was interrupted) import, export, analyze and write."""
    created = _folders_to_make(plan.out_dir)
    log_was_there = plan.log.exists()  # an earlier run's (--force): not ours to remove
    claim, interrupted = FolderClaim(plan.out_dir), False
    temporary = leftovers.snapshot()  # what the program's own processes may leave if it is stopped
    try:
        try:
            plan.out_dir.mkdir(parents=True, exist_ok=True)
            claim.take()
        except OSError as exc:  # a full disk, a read-only mount: one line, and no empty folder left behind
            claim.release()
            _remove_what_was_added(plan, created, log_was_there)
            raise cannot_write(plan.out_dir, exc) from None
        result = _execute(plan, progress)
        if result.window and result.window.ended_in_warmup:  # nothing captured, and a program that short
            notice, window = default_window.ran_again(result.window)  # costs little to profile in full
            if progress:
                progress(notice)
            result = _execute(default_window.full_plan(plan), progress)
            result.window = window
        return result
    except interrupts.Interrupted as exc:
        interrupted = True
        exc.kept = _keep_what_was_captured(plan, claim.held) + leftovers.named(temporary)
        if plan.window_file is not None:
            plan.window_file.unlink(missing_ok=True)
        raise
    finally:
        claim.release()
        if interrupted and not _captured(plan):  # nothing was captured: what it added to the folder goes
            _remove_what_was_added(plan, created, log_was_there)


def _execute(plan: Plan, progress: Progress | None) -> RunResult:
    opts = plan.options or RunOptions(target=plan.argv)
    log = NsysLog(plan.log)
    # an earlier run's reports in a reused folder (--force), of either kind: a folder analyzed later must not
    # count a rank twice (report.sqlite of the node beside rank0.sqlite, rank1.sqlite)
    for stale in [*rank_outputs(plan.out_dir), *REPORT_OUTPUTS]:
        (plan.out_dir / stale).unlink(missing_ok=True)
    prof = _profile(plan, log, progress)
    if prof.stuck and prof.rep is None:  # nsys never finished after the program ended: ended by us, no report
        if plan.window_file is not None:
            plan.window_file.unlink(missing_ok=True)
        result = RunResult(plan=plan, exit_code=0, profile=prof)
        _fail(result, NsysFailedError(f"{prof.problem} ({log.where()})"))
        return result
    if prof.interrupted and prof.rep is None and not prof.qdstrm:  # stopped before anything was captured
        raise interrupts.Interrupted(prof.signal, "three times: the capture was abandoned" if prof.abandoned else
                                     "while nsys was starting the program" if prof.aborted else
                                     "before the capture window opened" if plan.window_file else
                                     f"as the {'ranks' if plan.launcher else 'program'} started under nsys")
    if prof.never_started:
        if plan.window_file is not None:
            plan.window_file.unlink(missing_ok=True)
        result = RunResult(plan=plan, exit_code=0, profile=prof)
        said = log.tail()
        status = f"the launcher's status {prof.returncode}" if plan.launcher else f"status {prof.returncode}"
        _fail(result, NsysFailedError(f"nsys failed before it started the program"
                                      f"{' in any rank' if plan.launcher else ''} ({status})"
                                      + (f": {said}" if said else "") + f"; the program did not run ({log.where()})"))
        return result
    written = default_window.events(plan.window_file) if plan.window_file is not None else None
    window = (default_window.outcome(written, prof.returncode, prof.signal) if plan.capture_window is None else
              default_window.fixed_outcome(written, prof.returncode, plan.capture_window))
    oom = default_window.out_of_memory(written)
    if window and not window.opened and prof.rep is None:
        prof.problem = window.line
    code = _exit_code(prof)
    if code is None:  # nsys was killed before writing a report
        result = RunResult(plan=plan, exit_code=0, profile=prof)
        _fail(result, NsysFailedError(_nsys_killed(prof)))
        return result
    result = RunResult(plan=plan, exit_code=code, profile=prof, window=window, oom=oom)
    if prof.rep is None:
        beyond = window is not None and window.beyond_end  # the options asked for steps the program never ran
        _fail(result, (UsageError if beyond else NsysFailedError)(prof.problem or "nsys produced no report"))
        return result
    if prof.problem:  # some ranks left no report: the others are still analyzed
        _fail(result, NsysFailedError(prof.problem))
    result.written += prof.reports
    for rep in prof.reports:  # the raw streams (often 100+ MB); nsys deletes them too once imported
        with_suffix(stem_of(rep), ".qdstrm").unlink(missing_ok=True)
    interrupts.stage("while exporting the report")
    result.sqlites, failures = _export_all(plan, prof.reports, log, progress)
    for exc in failures:  # one rank's failed export leaves the others to analyze
        _fail(result, exc)
    if not result.sqlites:
        return result
    result.sqlite = result.sqlites[0]
    result.written += result.sqlites
    interrupts.stage("while analyzing the report")
    if progress:
        progress("Analyzing…" if len(result.sqlites) == 1 else f"Analyzing the {len(result.sqlites)} ranks together…")
    from nvtx_trace.analyzer import analyze

    try:
        warmup = 0 if plan.capture_window or (window and window.stepped) else None
        result.analysis = analyze(result.sqlites if len(result.sqlites) > 1 else result.sqlite,
                                  options=dataclasses.replace(plan.analysis, warmup_steps=warmup))
    except NvtxTraceError as exc:
        _fail(result, exc)
        return result
    if result.oom and result.exit_code != 0:  # it died of it outside the capture: the summaries say so all the same
        from nvtx_trace.analyzer.questions.memory import add_oom

        add_oom(result.analysis, result.oom)
    write_summaries(result, html=opts.html, progress=progress, max_points=opts.html_max_points)
    return result


def _export_all(plan: Plan, reports: list[Path], log: NsysLog, progress: Progress | None) \
        -> tuple[list[Path], list[NvtxTraceError]]:
    """Each report's SQLite export beside it (``report.sqlite``, or ``rankN.sqlite``), a few at a time;
    (the exports made, the failures)."""
    if progress:
        progress("Exporting to SQLite…" if len(reports) == 1 else
                 f"Exporting the {len(reports)} rank reports to SQLite…")

    def one(rep: Path) -> Path | NvtxTraceError:
        if interrupts.stopping():  # told to stop: no export starts after that
            return NsysFailedError(f"{rep.name} was not exported")
        try:
            return export_sqlite(plan.nsys, rep, with_suffix(stem_of(rep), ".sqlite"), log=log)
        except NvtxTraceError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(len(reports), MAX_PARALLEL_IMPORTS))) as pool:
        done = list(pool.map(one, reports))
    return [d for d in done if isinstance(d, Path)], [d for d in done if not isinstance(d, Path)]


REFUSED = ("usage: nsys", "nsys profile --help", "unrecognised option", "unrecognized option")  # nsys's option errors


def _profile(plan: Plan, log: NsysLog, progress: Progress | None) -> ProfileResult:
    """One capture; started once more after nsys failed before it started the program (nsys 2022.4 does so now and
    then on a busy machine): the program did not run, so nothing of it runs twice. nsys refusing its options fails
    the same way again, and is not retried."""
    def once() -> ProfileResult:
        return profile(plan.nsys, plan.argv, plan.stem, trace=plan.trace, extra=plan.extra, env=plan.env,
                       progress=progress, log=log, launcher=plan.launcher, ranks=plan.ranks)

    prof = once()
    said = log.last_words()
    if prof.never_started and not prof.stuck and not any(word in said for word in REFUSED):
        if progress:
            progress(f"nsys failed before it started the program (status {prof.returncode}: "
                     f"{tail(said) or 'nothing said'}); starting it once more")
        prof = once()
    return prof


def _exit_code(prof: ProfileResult) -> int | None:
    """The program's exit code as a shell would give it; None when nsys itself was killed."""
    code = prof.returncode
    if code < 0 and not prof.interrupted and prof.rep is None:
        return None
    if prof.interrupted:  # we were told to stop: the shell's code for that signal, whatever the program made of it
        return 128 + (prof.signal or signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP
    if code < 0:  # killed by a signal, shell-style
        return 128 - code
    return code


def _nsys_killed(prof) -> str:
    """One line: nsys died of a signal nobody sent through us; what is kept, and what still runs."""
    sig = interrupts.signal_name(-prof.returncode)
    kept = f"the capture so far is kept as {prof.qdstrm}" if prof.qdstrm else "no report was written"
    line = f"nsys was killed ({sig}) while profiling; {kept}"
    alive = prof.left_running
    if alive:
        groups = sorted({os.getpgid(p) for p in alive if _group_of(p)})
        stop = " ".join(f"-{g}" for g in groups) or " ".join(map(str, alive))
        line += (f"; the program still runs without the profiler (pid {', '.join(map(str, alive))}): "
                 f"left alone, stop it with kill -INT {stop}")
    return line


def _group_of(pid: int) -> bool:
    try:
        return os.getpgid(pid) > 1
    except OSError:
        return False


def _folders_to_make(folder: Path) -> list[Path]:
    """The folders that creating ``folder`` makes (it and its missing parents), deepest first."""
    made = []
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    return made


def _stems(plan: Plan) -> list[Path]:
    """The stems of every report this run wrote or started: ``report``, or one per rank."""
    if not plan.launcher:
        return [plan.stem]
    return sorted({stem_of(plan.out_dir / name) for name in rank_outputs(plan.out_dir)}, key=lambda p: p.name)


def _captured(plan: Plan) -> bool:
    return any(with_suffix(s, x).exists() for s in _stems(plan) for x in (".nsys-rep", ".qdstrm", ".sqlite"))


def _keep_what_was_captured(plan: Plan, ran: bool) -> str:
    """For an interrupted run: what it keeps and the command that finishes it, in words. A report whose import
    was under way (beside its ``.qdstrm``) may be half-written: it goes, the raw capture stays. Nothing is
    removed of a run that never claimed the folder (another run's)."""
    if not ran:
        return "nothing was captured"
    exports, reports, raw = [], [], []
    for stem in _stems(plan):
        rep, qdstrm, db = (with_suffix(stem, x) for x in (".nsys-rep", ".qdstrm", ".sqlite"))
        if qdstrm.exists():
            rep.unlink(missing_ok=True)
            raw.append(qdstrm)
        elif rep.exists():
            reports.append(rep)
        if db.exists():
            exports.append(db)
    several = len(_stems(plan)) > 1
    html = display(plan.path("summary.html"))
    if exports and not raw and len(exports) == len(reports):
        what = display(plan.out_dir) if several else display(exports[0])
        if plan.path("summary.json").exists():
            return (f"the capture, its export and {display(plan.path('summary.json'))} were kept: nvtx-trace "
                    f"analyze {what} --html {html} writes the HTML page")
        return (f"the capture and its export were kept: nvtx-trace analyze {what} --html {html}"
                " finishes the analysis")
    if reports and not raw:
        what = display(plan.out_dir) if several else display(reports[0])
        return f"the capture was kept: nvtx-trace analyze {what} --html {html} finishes the run"
    if raw:
        return (f"the raw capture was kept: nvtx-trace analyze {' '.join(display(p) for p in raw)} imports "
                "and analyzes it")
    return "nothing was captured"


def _remove_what_was_added(plan: Plan, created: list[Path], log_was_there: bool) -> None:
    """When nothing was captured: the nsys.log this run began (in a folder of the user's too, where a signal
    just after nsys started once left one), then the folders it made, if empty (its lock went with
    ``FolderClaim.release``; another run's stays, and so does the folder)."""
    if not log_was_there:
        plan.log.unlink(missing_ok=True)
    for made in created:
        try:
            made.rmdir()
        except OSError:  # something else is in it
            return


def _fail(result: RunResult, exc: NvtxTraceError) -> None:
    result.problems.append(str(exc))
    result.error = result.error or exc


def write_summaries(result: RunResult, html: bool = True, progress: Progress | None = None,
                    max_points: int = 20_000) -> None:
    """summary.json always; summary.html when the HTML reporter is available."""
    from nvtx_trace.report import json as json_report

    out = result.plan.path("summary.json")
    interrupts.stage("while writing the summaries")
    try:
        write_atomically(out, json_report.render(result.analysis))
    except NvtxTraceError as exc:  # a full disk: the report stays, and the run still says what it found
        _fail(result, exc)
        return
    result.written.append(out)
    if not html:
        return
    try:
        from nvtx_trace.report import html as html_report
    except ImportError as exc:
        result.problems.append(f"no HTML summary: {exc}")
        return
    if progress:
        progress("Writing the HTML summary…")
    out = result.plan.path("summary.html")
    try:
        html_report.write(result.analysis, out, max_points=max_points)
    except MissingDependencyError as exc:  # the findings and summary.json stand without it
        result.problems.append(f"no HTML summary: {exc}")
        return
    except NvtxTraceError as exc:
        _fail(result, exc)
        return
    result.written.append(out)


def next_command(result: RunResult) -> str | None:
    """What to type next, after the files are written."""
    html = result.plan.path("summary.html")
    if html in result.written:
        return f"open {display(html)}"
    if isinstance(result.error, BadReportError):
        return None  # the report holds nothing to analyze: analyzing it again would say the same
    if len(result.sqlites) > 1:
        return f"nvtx-trace analyze {display(result.plan.out_dir)} --html {display(html)}"
    if result.sqlite:
        return f"nvtx-trace analyze {display(result.sqlite)} --html {display(html)}"
    if result.profile and result.profile.rep:
        return f"nvtx-trace analyze {display(result.profile.rep)}"
    return None


def display(path: Path) -> str:
    """A path relative to the working directory when it is under it (shorter to type)."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        return shlex.quote(str(rel))
    except ValueError:
        return shlex.quote(str(path))
