"""The suite's end-of-session check fails on what its own processes left, never on another user's nsys beside it
(issue 52, item 20: a loaded pass failed on `/tmp/nsys_termination_status_18802`, written as the nsys capturing
beside the suite was killed, and blamed on a test that runs no nsys)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import conftest


def _sleeper(marked: bool) -> subprocess.Popen:
    """A stand-in for one process of an nsys capture: its program, whose environment names an injection config."""
    env = {k: v for k, v in os.environ.items() if marked or k != conftest.SUITE_MARK}
    env["QUADD_INJECTION_CONFIG"] = "/tmp/injection_config_00c0ffee"
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                            stdin=subprocess.DEVNULL)


def test_another_nsys_s_termination_status_is_not_the_suite_s_but_its_own_is():
    theirs, ours = _sleeper(marked=False), _sleeper(marked=True)
    files = [conftest.REAL_TMP / f"nsys_termination_status_{p.pid}" for p in (theirs, ours)]
    try:
        deadline = time.monotonic() + 10
        while str(theirs.pid) not in conftest._OTHERS_PIDS and time.monotonic() < deadline:
            time.sleep(0.2)  # the watcher looks twice a second
        for path in files:
            path.write_text("0")  # as nsys writes one for a process of its capture
    finally:
        for p in (theirs, ours):
            p.kill()
            p.wait()
    try:
        left = conftest.left_behind()
        assert not [line for line in left if files[0].name in line], left  # another nsys's
        assert [line for line in left if files[1].name in line], left  # a process the suite started: judged
    finally:
        for path in files:
            path.unlink(missing_ok=True)
