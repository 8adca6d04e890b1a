"""Issue 52, item 16: Ctrl-C during `run` printed a 45-line KeyboardInterrupt traceback through nvtx_autotrace's
frames in the program's output, and the closing line said "to the program's end". The traceback is the program's
own; the line says it was stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

PROGRAM = """
import os, signal, threading, torch
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
while True:
    y = m(torch.ones(2, 4))
"""


@pytest.mark.torch
@pytest.mark.slow  # a process of its own (issue 54: the unit loop runs in-process)
def test_a_ctrl_c_s_traceback_is_the_program_s_own(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(PROGRAM)
    # -X faulthandler: a run that never ends (seen once, under load) is sent SIGABRT and shows where it waits
    proc = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "nvtx_autotrace", str(script)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the program did not end within 120 s of its Ctrl-C; its threads:\n{err[-4000:]}")
    assert err.rstrip().endswith("KeyboardInterrupt"), err[-1000:]
    # where the program was: in the loop's body, or on its `while` line between two iterations (seen once)
    assert f'File "{script}", line 6' in err or f'File "{script}", line 5' in err, err
    assert "nvtx_autotrace" not in err and "runpy" not in err, err


def test_a_window_a_stopped_program_ended_says_it_was_stopped(tmp_path):
    from nvtx_trace.runner import default_window

    def outcome(exit_code, interrupted_by=None):
        path = tmp_path / "w.jsonl"  # read once, then removed: as the program wrote it, for each case
        path.write_text("\n".join(json.dumps(e) for e in (
            {"event": "opened", "pid": 1, "rank": None, "step": 8, "why": "the step pace settled", "at_s": 3.0},
            {"event": "ended", "pid": 1, "rank": None, "steps": 20, "phase": "window", "at_s": 6.0})) + "\n")
        return default_window.outcome(path, exit_code, interrupted_by).line

    assert "(to the program's end)" in outcome(0)
    stopped = outcome(-2)
    assert "profiled steps 8-19 (until the program was stopped, signal 2)" in stopped, stopped
    assert "(until the program ended, status 1)" in outcome(1)
    # the program caught the Ctrl-C the tool passed on and ended with status 0 (Lightning's graceful shutdown, seen
    # on the GPU machine): "to the program's end" was said, then "the program was interrupted"
    caught = outcome(0, signal.SIGINT)
    assert "profiled steps 8-19 (until the program was interrupted (SIGINT), status 0)" in caught, caught
    assert "(until the program was interrupted (SIGTERM), status 143)" in outcome(143, signal.SIGTERM)


def test_an_interrupted_run_names_what_the_program_s_processes_left_in_the_temporary_folder(tmp_path, monkeypatch):
    """Issue 52, item 5: multiprocessing's pymp-* folders (a DataLoader's workers) and torchelastic's run folders
    that appeared while the run ran are named in its one line; those that were there before are not, and none
    is removed (another program of the user's may own one)."""
    import tempfile

    from nvtx_trace.capture import leftovers

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "pymp-before").mkdir()
    before = leftovers.snapshot()
    assert leftovers.named(before) == ""
    for name in ("pymp-a1", "pymp-b2", "torchelastic_c3", "pymp-d4", "unrelated"):
        (tmp_path / name).mkdir()
    said = leftovers.named(before)
    assert said.startswith(f"; the program's processes left 4 temporary folders in {tmp_path} (")
    assert "pymp-a1, pymp-b2, pymp-d4 and 1 more" in said and "pymp-before" not in said and "unrelated" not in said
    assert (tmp_path / "pymp-a1").is_dir()
