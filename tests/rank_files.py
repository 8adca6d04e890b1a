"""Per-rank reports made from a real multi-process export, as `nsys profile -o rank%q{RANK}` would write them.

``split_by_process`` copies the export once per group of processes and deletes, in every table
keyed by a process (globalTid, globalPid, pid, processId), the rows of the processes that belong
to another group; tables of no process (StringIds, TARGET_INFO_*, ENUM_*, metadata) stay whole in
each copy. ``shift_clock`` moves one copy onto another clock, as a second host's would be.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

GLOBAL_KEYS = ("globalTid", "globalPid")  # pid in bits 24-47
PLAIN_KEYS = ("pid", "processId")
TIME_COLUMNS = ("start", "end", "timestamp", "startTime", "stopTime")


def _tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: [r[1] for r in conn.execute(f"PRAGMA table_info({t})")] for t in names}


def split_by_process(src: Path, out_dir: Path, groups: list[set[int]]) -> list[Path]:
    """One copy of ``src`` per group of pids; the first copy also keeps every process in no group
    (the launcher, system processes), so the copies together hold each row exactly once."""
    others = set().union(*groups[1:]) if len(groups) > 1 else set()
    out = []
    for i, pids in enumerate(groups):
        dst = Path(out_dir) / f"rank{i}.sqlite"
        shutil.copyfile(src, dst)
        conn = sqlite3.connect(dst)
        drop = others - pids if i == 0 else None
        for table, cols in _tables(conn).items():
            for col in cols:
                expr = f"(({col} >> 24) & 16777215)" if col in GLOBAL_KEYS else col if col in PLAIN_KEYS else None
                if expr is None:
                    continue
                if drop is not None:
                    conn.execute(f"DELETE FROM {table} WHERE {expr} IN ({','.join(map(str, drop)) or 'NULL'})")
                else:
                    conn.execute(f"DELETE FROM {table} WHERE {col} IS NOT NULL AND {expr} NOT IN "
                                 f"({','.join(map(str, pids))})")
        conn.commit()
        conn.execute("VACUUM")
        conn.close()
        out.append(dst)
    return out


def shift_clock(path: Path, shift_ns: int) -> None:
    """Add ``shift_ns`` to every timestamp of the report (NULLs stay NULL), session bounds included."""
    conn = sqlite3.connect(path)
    for table, cols in _tables(conn).items():
        for col in cols:
            if col in TIME_COLUMNS:
                conn.execute(f"UPDATE {table} SET {col} = {col} + ? WHERE {col} IS NOT NULL AND {col} > 0",
                             (shift_ns,))
    conn.commit()
    conn.close()


def ddp_rank_groups(path: Path) -> list[set[int]]:
    """The two ranks of the DDP sample and each one's DataLoader worker, paired by timing: a worker's
    fetch ends just before the wait of the rank it feeds ends (the batch arrives)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute("SELECT n.globalTid >> 24 & 16777215, s.value, n.end FROM NVTX_EVENTS n "
                        "JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60) "
                        "AND (s.value LIKE 'dataloader.next%' OR s.value LIKE 'dataloader.fetch%')").fetchall()
    conn.close()
    waits: dict[int, list[int]] = {}
    fetches: dict[int, list[int]] = {}
    for pid, name, end in rows:
        (waits if name.startswith("dataloader.next") else fetches).setdefault(pid, []).append(end)
    ranks = sorted(waits)

    def lag(worker: int, rank: int) -> float:
        """Median time from each fetch's end to the next wait end of that rank."""
        ends = sorted(waits[rank])
        gaps = [min((e - f for e in ends if e >= f), default=10**12) for f in fetches[worker]]
        return sorted(gaps)[len(gaps) // 2]

    groups = [{r} for r in ranks]
    for worker in fetches:
        best = min(range(len(ranks)), key=lambda i: lag(worker, ranks[i]))
        groups[best].add(worker)
    return groups
