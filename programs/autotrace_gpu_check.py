"""Summarise what nvtx_autotrace left in a CUDA export (run by hand on the GPU machine).

    python programs/autotrace_gpu_check.py run.sqlite

Prints range counts by kind and thread, and how many kernels launched from each
thread fall inside a ``backward <path> (<cls>)`` range on that same thread: the
measure of whether per-module backward attribution works where it matters.
"""

from __future__ import annotations

import bisect
import sqlite3
import sys
from collections import Counter, defaultdict


def main(path: str) -> int:
    con = sqlite3.connect(path)
    q = con.execute
    tname = {g: n for g, n in q("SELECT t.globalTid, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId")}
    ranges = q("""SELECT n.globalTid, COALESCE(s.value, n.text), n.start, n."end", n.eventType
                  FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
                  WHERE n.eventType IN (59, 60) AND n."end" IS NOT NULL""").fetchall()
    kinds = Counter()
    for g, name, _s, _e, _t in ranges:
        kind = name.split(" ")[0] if not name.startswith(("forward ", "backward ")) or "(" not in name \
            else name.split(" ")[0] + " <module>"
        kinds[(tname.get(g, str(g % 0x1000000)), kind)] += 1
    print("ranges by thread and kind:")
    for (thread, kind), n in sorted(kinds.items()):
        print(f"  {thread:24s} {kind:28s} {n:7d}")
    for name, n in Counter(r[1] for r in ranges if r[1].startswith(("copy.h2d", "sync ", "pin_memory"))).most_common(8):
        print(f"  e.g. {name!r} x{n}")

    bwd = defaultdict(list)  # thread -> sorted (start, end) of module backward ranges
    for g, name, s, e, _t in ranges:
        if name.startswith("backward ") and name.endswith(")"):
            bwd[g].append((s, e))
    for g in bwd:
        bwd[g].sort()
    tables = {r[0] for r in q("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        print("no kernels in this export")
        return 0
    launches = q("""SELECT r.globalTid, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k
                    JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
                      ON r.correlationId = k.correlationId AND r.globalTid / 0x1000000 = k.globalPid / 0x1000000""").fetchall()
    inside, total = Counter(), Counter()
    for g, t in launches:
        total[g] += 1
        spans = bwd.get(g, [])
        i = bisect.bisect_right(spans, (t, float("inf")))
        if any(s <= t <= e for s, e in spans[max(0, i - 64):i]):
            inside[g] += 1
    print("kernel launches inside a module backward range on the launching thread:")
    for g, n in total.most_common():
        print(f"  {tname.get(g, str(g % 0x1000000)):24s} {inside[g]:7d} / {n:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
