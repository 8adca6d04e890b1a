"""The profile that ``try --advice`` and each ``tune`` stage start from: ``runner.plan_run`` and ``runner.execute``
in a child process, the one child entry point of the runner.

    python -m nvtx_trace.runner.profile_child '{"program": [...], "out": "...", "python": null, "knobs": {...}}'

A child, not a call: a run owns signals, nsys and its own folder claim, and a crash in it must leave the caller
able to say what it kept. The request is one JSON object (the knobs' values as they are: no text round trip);
the child plans and runs as ``nvtx-trace run --out OUT --force --no-history [--try KNOBS] PROGRAM`` would, without
the command line, and says its progress and what it wrote on stderr. It runs in a process group of its own, so a
Ctrl-C reaches it once, through us (``interrupts.forwarding``); it ends its own processes and we wait for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nvtx_trace.capture import interrupts, lifeline
from nvtx_trace.capture.processes import OWN_GROUP
from nvtx_trace.errors import NvtxTraceError
from nvtx_trace.report.sections import printable


class ProfileFailed(NvtxTraceError):
    """The profile run wrote no summary.json: the line says why (the child's own words, from its outcome file), its
    exit status and where its output is; ``program_ran_clean``: the program itself exited 0 (so what failed is the
    analysis of what it did: nothing to analyze, no steps)."""

    def __init__(self, message: str, program_ran_clean: bool = False):
        super().__init__(message)
        self.program_ran_clean = program_ran_clean


def request(program: list[str], python: str | None, out: Path, knobs: dict | None = None) -> dict:
    """What the child is told: the program (``-m MODULE ...``, a script, or a command such as torchrun), the
    output folder, the Python that runs it, the knobs applied, and where it says how it ended (``outcome``:
    ``{"exit_code", "program_exit_code", "problems", "error"}``, removed once read)."""
    return {"program": list(program), "out": str(out), "python": python, "knobs": dict(knobs or {}),
            "outcome": str(outcome_path(out))}


def outcome_path(out: Path) -> Path:
    return out.parent / f"{out.name}.outcome.json"


def profile(program: list[str], python: str | None, out: Path, knobs: dict | None = None,
            stage: str = "while profiling", log: Path | None = None, env: dict | None = None) -> Path:
    """The program profiled (default window, no history row, ``knobs`` applied) into ``out``; the child's stderr
    goes to ``log`` when given (the caller shows progress of its own), else to ours; ``env``: variables added for
    the program (``NVTX_AUTOTRACE_*``)."""
    cmd = [sys.executable, "-m", __name__, json.dumps(request(program, python, out, knobs))]
    interrupts.stage(stage)
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    err = open(log, "w", encoding="utf-8", errors="replace") if log else None
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, **(env or {})}, **OWN_GROUP)
        line = lifeline.tie(proc)  # killed with SIGKILL, we take the run (and its nsys, its program) with us
        try:
            with interrupts.forwarding(proc):
                proc.wait()
            line.release()
        except interrupts.Interrupted as exc:  # the profile run stopped on its own terms: its line is above
            kept = f"what it kept is in {out}" if out.is_dir() and any(out.iterdir()) else "it kept nothing"
            exc.kept = f"the profile run ended (status {proc.returncode}); {kept}"
            raise
    finally:
        if err:
            err.close()
    said = _read_outcome(outcome_path(out))
    if not (out / "summary.json").is_file():
        where = f"its output is in {log}" if log else f"run nvtx-trace run {' '.join(program)} to see why"
        why = said.get("error") or "; ".join(said.get("problems") or []) or "it wrote no summary.json"
        raise ProfileFailed(f"the profile run failed (exit status {proc.returncode}): {why}; {where}",
                            program_ran_clean=said.get("program_exit_code") == 0)
    return out


def _read_outcome(path: Path) -> dict:
    import contextlib

    try:
        said = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        said = {}
    with contextlib.suppress(OSError):
        path.unlink()
    return said if isinstance(said, dict) else {}


def _say_outcome(asked: dict, **outcome) -> None:
    """The child's last word to its parent, as data (never a line of text to parse)."""
    if asked.get("outcome"):
        try:
            Path(asked["outcome"]).write_text(json.dumps(outcome), encoding="utf-8")
        except OSError:
            pass


def run_request(asked: dict) -> int:
    """The child's whole work: plan, profile, export, analyze, write; the exit code ``nvtx-trace run`` would give."""
    from nvtx_trace import runner

    def say(message: str) -> None:
        print(f"nvtx-trace: {printable(message[:1].lower() + message[1:])}", file=sys.stderr, flush=True)

    program = list(asked["program"])
    module = program[:1] == ["-m"]
    opts = runner.RunOptions(target=program[1:] if module else program, module=module, python=asked.get("python"),
                             out=Path(asked["out"]), force=True, tried=asked.get("knobs") or None)
    plan = runner.plan_run(opts)
    for note in plan.notes:
        say(f"warning: {note}")
    say(f"profiling {plan.capture} with nsys {plan.nsys.version}; outputs in {plan.out_dir}")
    result = runner.execute(plan, progress=say)
    if result.window is not None:
        say(result.window.line)
    for problem in result.problems:
        say(problem)
    for path in result.written:
        print(f"Wrote {printable(path)}", file=sys.stderr)
    code = result.exit_code if result.exit_code != 0 else (result.error.exit_code if result.error else 0)
    _say_outcome(asked, exit_code=code, program_exit_code=result.exit_code, problems=list(result.problems),
                 error=str(result.error) if result.error else None)
    return code


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    try:
        asked = json.loads(words[0])
        from nvtx_trace import knobs as declared

        asked["knobs"] = declared.checked(asked.get("knobs") or {})
    except (IndexError, ValueError, TypeError, AttributeError) as exc:
        print(f"nvtx-trace: error: the profile child takes one JSON request ({exc})", file=sys.stderr)
        return 2
    try:
        with interrupts.Guard():  # SIGINT, SIGTERM, SIGHUP: nothing started outlives the run, as under run
            return run_request(asked)
    except NvtxTraceError as exc:
        print(f"nvtx-trace: error: {exc}", file=sys.stderr)
        _say_outcome(asked, exit_code=exc.exit_code, program_exit_code=None, problems=[], error=str(exc))
        return exc.exit_code
    except interrupts.Interrupted as exc:
        print(f"nvtx-trace: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("nvtx-trace: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
