"""``nvtx-trace run`` as a child process: the profile that ``try --advice`` and each ``tune`` stage start from.

A child, not a call: run owns signals, nsys and its own folder claim, and a crash in it must leave the
caller able to say what it kept. It runs in a process group of its own, so a Ctrl-C reaches it once,
through us (``interrupts.forwarding``); it ends its own processes and we wait for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nvtx_trace import names
from nvtx_trace.capture import interrupts, lifeline
from nvtx_trace.capture.processes import OWN_GROUP
from nvtx_trace.errors import NvtxTraceError


class ProfileFailed(NvtxTraceError):
    """The profile run wrote no summary.json: the line says its exit status and where its output is."""


def profile(program: list[str], python: str | None, out: Path, knobs: dict | None = None,
            stage: str = "while profiling", log: Path | None = None, env: dict | None = None) -> Path:
    """``nvtx-trace run`` of the program (default window, no history row, ``knobs`` applied) into ``out``;
    its own stderr goes to ``log`` when given (the caller shows progress of its own), else to ours; ``env``:
    variables added for the program (``NVTX_AUTOTRACE_*``)."""
    cmd = [sys.executable, "-m", "nvtx_trace.cli", "run", "--out", str(out), "--force", "--no-history",
           *(["--python", python] if python else []),
           *(["--try", names.knobs_text(knobs)] if knobs else []),
           *(program if program[:1] == ["-m"] else ["--", *program])]  # a torchrun job's options stay its own
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
    if not (out / "summary.json").is_file():
        where = f"its output is in {log}" if log else f"run nvtx-trace run {' '.join(program)} to see why"
        raise ProfileFailed(f"the profile run wrote no summary.json (exit status {proc.returncode}); {where}")
    return out
