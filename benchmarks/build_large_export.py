"""Build large Nsight Systems exports from a real one by replicating its steady-state steps.

    python benchmarks/build_large_export.py --kernels 1000000 [--source sample_reports/resnet_flawed_user.sqlite]

The rows of steps 1..N (the steady state: the first step is warm-up) are copied
k times, each copy shifted by k periods, entirely inside SQLite
(``INSERT ... SELECT`` from the attached source), so 10M kernels take minutes:

    source:  [step 0][step 1 .. step N][tail]
    output:  [step 0][step 1 .. N][copy 1: step N+1 .. 2N]...[copy K-1][tail shifted by (K-1) periods]

What stays consistent in every copy:
- kernels, memcpy, memset, runtime/driver API calls, CUDA synchronization rows and
  NVTX ranges of the window are all shifted by the same ``k * period``;
- ``correlationId`` is offset by ``k * (max correlationId + 1)`` in every table, so it
  stays unique per process and kernel <-> API-call joins still pair up;
- NVTX ``step i`` ranges of copy k are renamed ``step i + k*N`` through new
  ``StringIds`` rows (one per new step number); other names keep their ids;
- rows after the last step (teardown) move behind the last copy; ``ANALYSIS_DETAILS``
  is stretched accordingly. Rows are inserted in time order, as nsys writes them.

Not replicated (the analyzer and nsys's rules do not need them): ``CUPTI_ACTIVITY_KIND_CUDA_EVENT``
(no timestamps), ``PROFILER_OVERHEAD`` (none inside the window of the sample), OS runtime tables.

Outputs are cached outside the repository (default ``/work/.bench-cache``, or
``$NVTX_TRACE_BENCH_CACHE``), keyed by the source's SHA-256 and the copy count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "sample_reports" / "resnet_flawed_user.sqlite"
DEFAULT_CACHE = Path(os.environ.get("NVTX_TRACE_BENCH_CACHE", "/work/.bench-cache"))
BUILDER_VERSION = 1

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
# Tables whose rows are replicated; all have start/end and correlationId except NVTX_EVENTS.
TIMED_TABLES = [
    KERNEL,
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION",
]
CORR_TABLES = TIMED_TABLES + ["CUPTI_ACTIVITY_KIND_CUDA_EVENT"]
STEP_GLOB = "step [0-9]*"
RANGE_TYPES = "59, 60, 70, 71"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def quoted(cols: list[str]) -> list[str]:
    return [f'"{c}"' for c in cols]


class Plan:
    """The replication window of a source export: steady-state steps and their period."""

    def __init__(self, conn: sqlite3.Connection):
        steps = conn.execute(
            "SELECT n.start, n.end, CAST(substr(s.value, 6) AS INTEGER) AS i, n.globalTid FROM NVTX_EVENTS n "
            f"JOIN StringIds s ON s.id = n.textId WHERE s.value GLOB '{STEP_GLOB}' "
            f"AND n.eventType IN ({RANGE_TYPES}) ORDER BY n.start"
        ).fetchall()
        if len(steps) < 3:
            raise SystemExit("source needs at least 3 `step N` ranges")
        self.first_step = steps[1][2]  # step 0 is warm-up, never replicated
        self.last_step = steps[-1][2]
        self.steps_per_copy = self.last_step - self.first_step + 1
        self.w0 = steps[1][0]
        # Period: the window plus one typical pause between steps, so copies do not touch.
        pauses = sorted(b[0] - a[1] for a, b in zip(steps, steps[1:]))
        self.period = steps[-1][1] - self.w0 + pauses[len(pauses) // 2]
        self.w1 = self.w0 + self.period
        self.corr_stride = 1 + max(
            conn.execute(f"SELECT COALESCE(max(correlationId), 0) FROM {t}").fetchone()[0]
            for t in CORR_TABLES if _has(conn, t)
        )
        self.max_string_id = conn.execute("SELECT max(id) FROM StringIds").fetchone()[0]
        self.kernels_total = conn.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0]
        self.kernels_window = conn.execute(
            f"SELECT count(*) FROM {KERNEL} WHERE start >= ? AND start < ?", (self.w0, self.w1)).fetchone()[0]
        for t in TIMED_TABLES + ["NVTX_EVENTS"]:
            if _has(conn, t):
                n = conn.execute(f"SELECT count(*) FROM {t} WHERE start >= ? AND start < ? AND end > ?",
                                 (self.w0, self.w1, self.w1)).fetchone()[0]
                if n:
                    raise SystemExit(f"{t}: {n} row(s) straddle the end of the window; pick another source")

    def copies_for(self, kernels: int) -> int:
        """Copies of the window (the original counts as the first) to reach about ``kernels``."""
        rest = self.kernels_total - self.kernels_window
        return max(1, round((kernels - rest) / self.kernels_window))

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


def _has(conn: sqlite3.Connection, table: str, schema: str = "main") -> bool:
    return conn.execute(f"SELECT 1 FROM {schema}.sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() \
        is not None


def build(source: Path, dest: Path, copies: int, log=print) -> dict:
    """Write ``dest``: the source with its steady-state window repeated ``copies`` times in all."""
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    plan = Plan(src)
    src.close()
    tmp = dest.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    shutil.copyfile(source, tmp)
    conn = sqlite3.connect(tmp, isolation_level=None)
    conn.execute("PRAGMA journal_mode=OFF")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-262144")
    conn.execute("PRAGMA temp_store=MEMORY")
    conn.execute("ATTACH ? AS src", (f"{source.resolve().as_uri()}?mode=ro",))
    conn.execute("BEGIN")
    P, C, K = plan.period, plan.corr_stride, copies
    conn.execute("CREATE TEMP TABLE ks(k INTEGER PRIMARY KEY)")
    conn.executemany("INSERT INTO temp.ks VALUES (?)", [(k,) for k in range(1, K)])
    tail_shift = (K - 1) * P
    t0 = time.perf_counter()
    for table in TIMED_TABLES:
        if not _has(conn, table):
            continue
        cols = quoted(columns(conn, table))
        shifted = [
            f"w.{c} + ks.k * {P}" if c in ('"start"', '"end"') else
            f"w.{c} + ks.k * {C}" if c == '"correlationId"' else f"w.{c}" for c in cols
        ]
        tail = [f"{c} + {tail_shift}" if c in ('"start"', '"end"') else c for c in cols]
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} SELECT * FROM src.{table} WHERE start < ? ORDER BY rowid", (plan.w1,))
        conn.execute(
            f"INSERT INTO main.{table} SELECT {', '.join(shifted)} FROM temp.ks CROSS JOIN "
            f"(SELECT * FROM src.{table} WHERE start >= ? AND start < ? ORDER BY rowid) w ORDER BY ks.k",
            (plan.w0, plan.w1))
        conn.execute(f"INSERT INTO main.{table} SELECT {', '.join(tail)} FROM src.{table} WHERE start >= ? "
                     "ORDER BY rowid", (plan.w1,))
        log(f"  {table}: {conn.execute(f'SELECT count(*) FROM main.{table}').fetchone()[0]:,} rows "
            f"({time.perf_counter() - t0:.1f} s)")
    _replicate_nvtx(conn, plan, K)
    log(f"  NVTX_EVENTS: {conn.execute('SELECT count(*) FROM main.NVTX_EVENTS').fetchone()[0]:,} rows")
    if _has(conn, "PROFILER_OVERHEAD"):
        conn.execute(f'UPDATE main.PROFILER_OVERHEAD SET start = start + {tail_shift}, "end" = "end" + {tail_shift} '
                     "WHERE start >= ?", (plan.w1,))
    if _has(conn, "ANALYSIS_DETAILS"):
        conn.execute(f"UPDATE main.ANALYSIS_DETAILS SET stopTime = stopTime + {tail_shift}, "
                     f"duration = duration + {tail_shift}")
    conn.execute("COMMIT")
    kernels = conn.execute(f"SELECT count(*) FROM main.{KERNEL}").fetchone()[0]
    conn.execute("DETACH src")
    conn.close()
    os.replace(tmp, dest)
    return {"copies": K, "kernels": kernels, "plan": plan.as_dict(), "seconds": round(time.perf_counter() - t0, 1)}


def _replicate_nvtx(conn: sqlite3.Connection, plan: Plan, K: int) -> None:
    """NVTX ranges of the window, shifted; ``step i`` of copy k becomes ``step i + k*N`` (new StringIds)."""
    if not _has(conn, "NVTX_EVENTS"):
        return
    P, N = plan.period, plan.steps_per_copy
    first_new = plan.last_step + 1
    id_base = plan.max_string_id + 1 - first_new  # StringIds id of `step n` (n >= first_new) = id_base + n
    conn.execute("CREATE TEMP TABLE stepmap AS SELECT id, CAST(substr(value, 6) AS INTEGER) AS i "
                 f"FROM src.StringIds WHERE value GLOB '{STEP_GLOB}'")
    conn.execute("INSERT INTO main.StringIds (id, value) SELECT ? + n, 'step ' || n FROM "
                 "(WITH RECURSIVE r(n) AS (SELECT ? UNION ALL SELECT n + 1 FROM r WHERE n < ?) SELECT n FROM r)",
                 (id_base, first_new, plan.last_step + (K - 1) * N))
    cols = quoted(columns(conn, "NVTX_EVENTS"))
    shifted = [
        f"w.{c} + ks.k * {P}" if c in ('"start"', '"end"') else
        f"CASE WHEN sm.i IS NULL THEN w.{c} ELSE {id_base} + sm.i + ks.k * {N} END" if c == '"textId"' else
        f"w.{c}" for c in cols
    ]
    tail_shift = (K - 1) * P
    tail = [f"{c} + {tail_shift}" if c in ('"start"', '"end"') else c for c in cols]
    conn.execute("DELETE FROM main.NVTX_EVENTS")
    conn.execute("INSERT INTO main.NVTX_EVENTS SELECT * FROM src.NVTX_EVENTS WHERE start < ? ORDER BY rowid",
                 (plan.w1,))
    conn.execute(
        f"INSERT INTO main.NVTX_EVENTS SELECT {', '.join(shifted)} FROM temp.ks CROSS JOIN "
        f"(SELECT rowid AS rid, * FROM src.NVTX_EVENTS WHERE start >= ? AND start < ?) w "
        f"LEFT JOIN temp.stepmap sm ON sm.id = w.textId AND w.eventType IN ({RANGE_TYPES}) ORDER BY ks.k, w.rid",
        (plan.w0, plan.w1))
    conn.execute(f"INSERT INTO main.NVTX_EVENTS SELECT {', '.join(tail)} FROM src.NVTX_EVENTS WHERE start >= ? "
                 "ORDER BY rowid", (plan.w1,))


def cached_export(kernels: int, source: Path = DEFAULT_SOURCE, cache: Path = DEFAULT_CACHE, log=print) -> tuple[Path, dict]:
    """Path of an export with about ``kernels`` kernels, built once and reused (keyed by source hash)."""
    cache.mkdir(parents=True, exist_ok=True)
    digest = sha256(source)
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    copies = Plan(src).copies_for(kernels)
    src.close()
    dest = cache / f"{source.stem}-x{copies}-{digest[:12]}-v{BUILDER_VERSION}.sqlite"
    meta_path = dest.with_suffix(".json")
    if dest.exists() and meta_path.exists():
        return dest, json.loads(meta_path.read_text())
    free = shutil.disk_usage(cache).free
    need = source.stat().st_size * copies * 1.2
    if free < need + (2 << 30):
        raise SystemExit(f"not enough disk in {cache}: {free / 2**30:.1f} GiB free, ~{need / 2**30:.1f} GiB needed")
    log(f"building {dest.name} ({copies} copies of the steady-state window, ~{kernels:,} kernels) ...")
    meta = build(source, dest, copies, log=log)
    meta.update({"source": str(source), "source_sha256": digest, "bytes": dest.stat().st_size,
                 "builder_version": BUILDER_VERSION})
    meta_path.write_text(json.dumps(meta, indent=1))
    log(f"  wrote {dest} ({meta['bytes'] / 2**20:,.0f} MiB, {meta['kernels']:,} kernels, {meta['seconds']} s)")
    return dest, meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[1_000_000], help="target kernel counts")
    ap.add_argument("--copies", type=int, help="exact number of window copies (overrides --kernels)")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("-o", "--output", type=Path, help="with --copies: write here instead of the cache")
    args = ap.parse_args(argv)
    if not args.source.exists():
        raise SystemExit(f"{args.source}: no such file")
    if args.copies:
        dest = args.output or args.cache / f"{args.source.stem}-x{args.copies}.sqlite"
        dest.parent.mkdir(parents=True, exist_ok=True)
        meta = build(args.source, dest, args.copies)
        print(f"wrote {dest}: {json.dumps(meta)}")
        return 0
    for k in args.kernels:
        path, meta = cached_export(k, args.source, args.cache)
        print(f"{path}\t{meta['kernels']} kernels\t{meta['bytes']} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
