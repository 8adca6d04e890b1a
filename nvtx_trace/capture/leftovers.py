"""What a stopped program's own processes leave in the temporary folder: multiprocessing's ``pymp-*`` folders
(its DataLoader workers' listener sockets) and torchelastic's run folders. A run that was interrupted names the
ones that appeared while it ran, in its one line; it cannot tell them from those of another program started in the
same minutes, so it removes none."""

from __future__ import annotations

import tempfile
from pathlib import Path

PATTERNS = ("pymp-*", "torchelastic_*")
SHOWN = 3


def snapshot() -> set[Path]:
    """The program-made folders in the temporary folder now (before the program starts)."""
    folder = Path(tempfile.gettempdir())
    try:
        return {p for pattern in PATTERNS for p in folder.glob(pattern)}
    except OSError:
        return set()


def named(before: set[Path]) -> str:
    """"" or ``; its processes left N temporary folders in /tmp (pymp-..., ...): ...`` for what appeared since."""
    new = sorted(snapshot() - before)
    if not new:
        return ""
    shown = ", ".join(p.name for p in new[:SHOWN]) + (f" and {len(new) - SHOWN} more" if len(new) > SHOWN else "")
    return (f"; the program's processes left {len(new)} temporary folder{'s' if len(new) > 1 else ''} in "
            f"{new[0].parent} ({shown}): remove them once no other program of yours is running")
