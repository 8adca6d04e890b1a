"""Keep only the first steps of an Nsight Systems export, to ship a smaller sample (the tree a GPU call carries
is 64 MiB at most). Usage: python scripts/trim_report.py IN.sqlite OUT.sqlite --steps N

The capture is cut where the (N+1)-th `step N` range begins: CPU-side rows (NVTX, runtime calls, profiler
overhead, OS calls, diagnostics) that start after the cut go, GPU work goes with the runtime call that launched
it (a kernel launched before the cut still runs after it), NVTX ranges open across the cut end at it, and the
session's stop time becomes the last kept event's end. Everything before the cut is byte-identical, so the warm-up,
the records nvtx_autotrace writes when a window opens and the first N steps analyze as they did.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True, help="step ranges to keep")
    a = p.parse_args()
    shutil.copyfile(a.source, a.out)
    db = sqlite3.connect(a.out)
    starts = [r[0] for r in db.execute(
        "SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*' ORDER BY e.start")]
    if len(starts) <= a.steps:
        print(f"{a.source} has {len(starts)} step ranges; nothing to trim", file=sys.stderr)
        return 1
    cut = starts[a.steps]
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    cols = {t: {r[1] for r in db.execute(f'PRAGMA table_info("{t}")')} for t in tables}
    gpu = [t for t in tables if {"start", "deviceId", "correlationId"} <= cols[t]]
    launches = [t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_RUNTIME") or t == "CUDA_CALLCHAINS"]
    db.execute("CREATE TEMP TABLE gone (pid INTEGER, corr INTEGER, PRIMARY KEY (pid, corr))")
    for t in launches:
        if {"correlationId", "start", "globalTid"} <= cols[t]:  # calls made after the cut (ids are per process)
            db.execute(f'INSERT OR IGNORE INTO gone SELECT globalTid / 16777216, correlationId FROM "{t}" '
                       f'WHERE start >= {cut}')
    for g in gpu:  # their GPU work
        same = f'gone.pid = "{g}".globalPid / 16777216 AND ' if "globalPid" in cols[g] else ""
        db.execute(f'DELETE FROM "{g}" WHERE EXISTS (SELECT 1 FROM gone WHERE {same}gone.corr = "{g}".correlationId)')
    for t in tables:
        if t in gpu:
            continue
        if "start" in cols[t]:
            db.execute(f'DELETE FROM "{t}" WHERE start >= {cut}')
            if "end" in cols[t]:
                db.execute(f'UPDATE "{t}" SET end = {cut} WHERE end > {cut}')
        elif "timestamp" in cols[t]:
            db.execute(f'DELETE FROM "{t}" WHERE timestamp >= {cut}')
    last = max(db.execute(f'SELECT coalesce(max(end), 0) FROM "{t}"').fetchone()[0]
               for t in tables if "end" in cols[t])
    if "ANALYSIS_DETAILS" in tables:
        db.execute("UPDATE ANALYSIS_DETAILS SET stopTime = ?, duration = ? - startTime", (last + 1000, last + 1000))
    db.commit()
    db.execute("VACUUM")
    db.close()
    print(f"{a.out}: kept {a.steps} of {len(starts)} step ranges (cut at {cut} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
