"""The watchdog of lifeline.py, run as a file (``python -I -S _watchdog.py ROOT_PID ROOT_START [PATH...]``): no
package import, so it starts in milliseconds. Stdin is the pipe; end of file without "done" means the tool died;
the PATHs are the tool's temporary files and folders, removed after the kill."""

import os
import re
import shutil
import signal
import sys
import time


def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            tail = fh.read().rsplit(")", 1)[1].split()
        return tail  # state ppid pgrp session ... starttime at [19]
    except (OSError, IndexError):
        return None


ME = os.path.abspath(__file__).encode()


def watchdog(pid):
    """Another watchdog of ours (a profile run's, under tune): it is spared, since it removes what its own tool's
    nsys left (the raw capture, the scratch folder) once that tool is gone, which a kill of it would leave."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return ME in fh.read().split(b"\0")
    except OSError:
        return False


def tree(root):
    """root and every live process under it, by parent links (other watchdogs aside: ``watchdog``)."""
    children = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = stat(name)
            if s and s[0] != "Z" and not watchdog(name):
                children.setdefault(int(s[1]), []).append(int(name))
    found, todo = [root], list(children.get(root, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def agents(nsys_pids, since):
    """``nsys --start-agent`` helpers named after these nsys processes (their session name ends in the pid),
    started since ``since``: they leave their nsys's tree, and outlive it unless killed."""
    marks = {str(p) for p in nsys_pids}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = [w.decode("utf-8", "replace") for w in fh.read().split(b"\0") if w]
        except OSError:
            continue
        # --session-name=NAME (nsys 2022.4) or --session-name NAME (2025.3), as processes.agent_session reads it
        names = [a.split("=", 1)[1] for a in args if a.startswith("--session-name=")]
        names += [b for a, b in zip(args, args[1:]) if a == "--session-name"]
        if "--start-agent" in args and any(n.rsplit("-", 1)[-1] in marks for n in names):
            t = stat(name)
            if t is not None and int(t[19]) >= since:
                found.append(int(name))
    return found


NSYS_TEMP_FILE_RE = re.compile(r"^QUADD_\w*CONFIG$")  # one per trace (injection, CUDA, OS runtime), removed at its end


def nsys_temp_files(pid):
    """The files nsys made for this process of the tree (named in its environment) that only its end removes."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            pairs = [w.decode("utf-8", "replace").split("=", 1) for w in fh.read().split(b"\0") if b"=" in w]
    except OSError:
        return []
    return [value for key, value in pairs
            if NSYS_TEMP_FILE_RE.match(key) and os.path.basename(value).startswith("injection_config_")]


def clean(paths):
    for path in paths:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass


def main():
    root, born, ours = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    said = b""
    while True:
        chunk = os.read(0, 64)
        if not chunk:
            break
        said += chunk
    if said.startswith(b"done"):
        return 0
    s = stat(root)
    if s is None or s[19] != born:  # already gone, or its pid is another process's now
        clean(ours)
        return 0
    seen = {}  # pid -> its start time: a pid is killed only while it is still that process
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        top = stat(root)
        if top is not None and top[19] == born and top[0] != "Z":  # its tree, before its children lose it
            for p in tree(root):
                t = stat(p)
                if t is not None and p not in seen:
                    seen[p] = t[19]
                    ours += nsys_temp_files(p)
        for p in agents(list(seen), int(born)):
            t = stat(p)
            if t is not None:
                seen.setdefault(p, t[19])
        alive = [p for p, b in seen.items() if (t := stat(p)) is not None and t[19] == b and t[0] != "Z"]
        if not alive:
            break
        for p in alive:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    try:  # what nsys keeps in /dev/shm for a process it ran (nsys_files.SHM_NAMES): a kill leaves it
        shm = os.listdir("/dev/shm")
    except OSError:
        shm = []
    for p, b in seen.items():
        t = stat(p)
        if t is None or (t[0] == "Z" and t[19] == b):  # ended (a zombie until init reaps it: the program's is)
            named = (f"quadd-agent-instance-{p}", f"sem.nsys_sem_{p}")
            clean([os.path.join("/dev/shm", n) for n in shm
                   if n in named or n.startswith(f"sem.NSys-process_waiter-{p}-")])
    tmp = {"/tmp", os.environ.get("TMPDIR") or "/tmp"}
    clean(ours + [os.path.join(t, f"nsys_termination_status_{p}") for t in tmp for p in seen])
    return 0


if __name__ == "__main__":
    sys.exit(main())
