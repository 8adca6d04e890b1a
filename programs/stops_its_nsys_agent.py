"""Ends by stopping (SIGSTOP) the nsys agent that profiles it, so that nsys waits for the agent for ever: a real
nsys that never finishes its report after the program ended, as nsys 2022.4 does by itself now and then (its
agent spinning). Only the agent of this program's own nsys is stopped (its session is named after nsys's pid)."""

import os
import signal
import time
from pathlib import Path


def own_nsys_pids() -> set[str]:
    """The pids above this process (nsys is one of them: nsys -> launcher -> this program)."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        pids.add(str(pid))
    return pids


time.sleep(0.5)
only = os.environ.get("STOP_AGENT_OF_RANK")  # under a launcher: this rank's only; the others end as usual
if only is not None and os.environ.get("RANK") != only:
    print(f"rank {os.environ.get('RANK')} ended", flush=True)
    raise SystemExit(0)
ours = own_nsys_pids()
for entry in Path("/proc").glob("[0-9]*"):
    try:
        args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        continue
    names = [a.split("=", 1)[1] for a in args if a.startswith("--session-name=")]  # nsys 2022.4
    names += [b for a, b in zip(args, args[1:]) if a == "--session-name"]  # 2025.3
    if "--start-agent" in args and any(n.rsplit("-", 1)[-1] in ours for n in names):
        os.kill(int(entry.name), signal.SIGSTOP)
        print(f"stopped nsys's agent (pid {entry.name})", flush=True)
