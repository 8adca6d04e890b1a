"""Which processes are alive, read from /proc: what nsys left running when it died."""

from __future__ import annotations

from pathlib import Path


def live_processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process (Linux /proc; [] elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp ...
            if fields[0] != "Z":
                found.append((int(entry.parent.name), int(fields[1]), int(fields[2])))
        except (OSError, IndexError, ValueError):
            continue
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``: what nsys left running."""
    return sorted(pid for pid, _, group in live_processes() if group == pgid)


def descendants(pid: int) -> list[int]:
    """Live processes started by ``pid``, however deep, whatever their session (torchrun starts each rank in
    a session of its own, so killing torchrun's group leaves them running)."""
    children: dict[int, list[int]] = {}
    for child, parent, _ in live_processes():
        children.setdefault(parent, []).append(child)
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return sorted(found)
