"""A child's processes die with us, SIGKILL included: a job scheduler's final kill, the OOM killer, ``timeout -s
KILL``. A signal handler cannot see SIGKILL, so a watchdog does: a small Python in a session of its own (a kill
of our process group leaves it) reads a pipe whose write end only we hold. Our death closes it; reading end of
file without our word that we finished, it kills the child and every process the child started (nsys, its
agent, the program, its DataLoader workers), found by parent links in /proc, and removes what they can no longer:
our temporary folders, named when tied, and the files nsys keeps in /tmp while it runs (the injection configs
named in the program's environment, its termination-status files).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from nvtx_trace.capture.processes import started_at

WATCHDOG = Path(__file__).with_name("_watchdog.py")
DONE = b"done"


class Lifeline:
    def __init__(self, pid: int, remove: Sequence[str | os.PathLike] = ()):
        self._write = None
        self.watchdog = None
        born = started_at(pid)
        if born is None or not sys.platform.startswith("linux"):
            return
        read, write = os.pipe()  # not inheritable (PEP 446): no other child holds the write end
        try:
            self.watchdog = subprocess.Popen([sys.executable, "-I", "-S", str(WATCHDOG), str(pid), str(born),
                                              *map(str, remove)],
                                             stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True, close_fds=True)
        except OSError:
            os.close(write)
            return
        finally:
            os.close(read)
        self._write = write

    def release(self) -> None:
        """The child ended (or we ended it): the watchdog leaves without killing anything."""
        if self._write is None:
            return
        try:
            os.write(self._write, DONE)
        except OSError:
            pass
        os.close(self._write)
        self._write = None
        if self.watchdog is not None:
            try:
                self.watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()


def tie(proc: subprocess.Popen, remove: Sequence[str | os.PathLike] = ()) -> Lifeline:
    """``proc`` and what it starts are ended if this process dies before ``release()``, and the temporary files
    or folders in ``remove`` are removed then."""
    return Lifeline(proc.pid, remove)
