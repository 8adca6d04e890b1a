"""`nvtx-trace run`, once cli/run.py has parsed its options: the plan and the history checked before anything runs,
what is about to run shown on stderr, the run with its progress, then the findings, the "Wrote ..." lines, the next
command, and the history row with what changed since the last run of the same script. In runner/, as ``try`` and
``tune`` do the same, so that every CLI command only parses and calls.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace.report.console import command_lines, console, framing
from nvtx_trace.report.sections import printable
from nvtx_trace.runner.plan import RunOptions


@dataclass
class RunRequest:
    """What the user asked `run` for (cli/run.py parses it): the run's options and where its history goes."""

    options: RunOptions
    history_path: Path | None = None
    no_history: bool = False


def run_profile(req: RunRequest) -> int:
    """The whole of `nvtx-trace run` after its options: its exit code, the program's (else our error's)."""
    from rich.markup import escape

    from nvtx_trace import runner
    from nvtx_trace.runner import history

    began = time.time()
    err = console(stderr=True, highlight=False)
    opts, tried = req.options, req.options.tried
    history_db = history.resolve_path(req.history_path, disabled=req.no_history)
    plan = runner.plan_run(opts)
    history.check(history_db, inputs=[Path(t) for t in opts.target[:1]], written=plan.owns)  # before it runs
    for note in plan.notes:
        err.print(f"[yellow]warning:[/yellow] {escape(printable(note))}", soft_wrap=True)
    framing(err, printable(f"nvtx-trace: profiling {plan.capture} with nsys {plan.nsys.version}; outputs in "
                           f"{plan.out_dir}" + (f"; knobs applied: {declared.text(tried)}" if tried else "")))
    if err.is_terminal:  # a command to copy: cut at words with shell continuations
        for line in command_lines(plan.nsys_command(), err.width):
            err.print(printable(line), style="dim", soft_wrap=True, markup=False, highlight=False)
    else:
        err.print(printable(f"$ {shlex.join(plan.nsys_command())}"), style="dim", soft_wrap=True, markup=False)

    progress = Progress(err)
    try:
        result = runner.execute(plan, progress=progress)
    finally:
        progress.stop()
    try:
        _report(result, err)
    finally:  # a closed or full stdout costs the findings on screen, not the run's row in the history
        change, warning = history.after_run(result, history_db, began)
        if warning:
            err.print(f"nvtx-trace: warning: {warning}", soft_wrap=True, markup=False)
        if change:
            err.print(f"nvtx-trace: {change}", soft_wrap=True, markup=False)
    if result.exit_code != 0:
        return result.exit_code
    return result.error.exit_code if result.error else 0


class Progress:
    """Our own progress lines: a spinner on a terminal, plain lines otherwise (logs, CI).

    Steps under way (import, export, analysis) end with "…"; other messages (the capture's end, a
    forwarded Ctrl-C) are lines either way. While the program runs nothing is drawn: the terminal is its.
    """

    def __init__(self, err):
        self.err, self.status = err, None

    def __call__(self, message: str) -> None:
        under_way = message.endswith("…") and not message.startswith(("Stopping", "Still"))
        if not under_way or not self.err.is_terminal:
            self.err.print(f"nvtx-trace: {message[:1].lower()}{message[1:]}", soft_wrap=True, markup=False)
            return
        if self.status is None:
            self.status = self.err.status(message, spinner="dots")
            self.status.start()
        self.status.update(message)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


def _report(result, err) -> None:
    """What a finished run prints: the findings on stdout; the window, problems, files written and the next
    command on stderr."""
    from nvtx_trace import runner
    from nvtx_trace.report import text

    prof = result.profile
    if result.analysis is not None:
        text.render(result.analysis, console())
    if result.window is not None and result.window.line not in result.problems:
        err.print(f"nvtx-trace: {result.window.line}", soft_wrap=True, markup=False)
    if result.oom and result.exit_code != 0 and result.analysis is None:  # no report: the program's record alone
        from nvtx_trace.analyzer.questions.memory import explain_oom

        said = explain_oom({"oom": result.oom})
        err.print(printable(f"nvtx-trace: {said.title}"), soft_wrap=True, markup=False)
        err.print(printable(f"   fix: {said.fix}"), soft_wrap=True, markup=False)
    for problem in result.problems:
        err.print(f"[red]nvtx-trace: {problem}[/red]", soft_wrap=True)  # one line, however long
    for path in result.written:
        print(f"Wrote {printable(runner.display(path))}", file=sys.stderr)
    if result.exit_code != 0:
        from nvtx_trace.capture.interrupts import signal_name

        told = prof is not None and prof.interrupted
        why = f"was interrupted ({signal_name(prof.signal)})" if told else f"exited with status {result.exit_code}"
        reports = [p for p in result.written if p.suffix in (".nsys-rep", ".sqlite")]
        if told and reports and result.analysis is None:  # stopped before it did anything to analyze
            several = len(prof.reports) > 1  # one per rank: the folder
            after = f"what was captured is kept in {runner.display(result.plan.out_dir if several else reports[0])}"
        else:
            after = "the report covers what ran until then" if reports else "no report was written"
        err.print(f"nvtx-trace: the program {why}; {after}", soft_wrap=True, markup=False)
    nxt = runner.next_command(result)
    if nxt:
        print(f"Next: {nxt}", file=sys.stderr)
