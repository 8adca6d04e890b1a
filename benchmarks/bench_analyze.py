"""How nvtx-trace scales: wall time and peak memory on large exports, next to a floor and nsys.

    python benchmarks/bench_analyze.py                       # 1M, 5M, 10M kernels
    python benchmarks/bench_analyze.py --kernels 1000000 --repeat 3 --no-nsys

For each size (exports built by build_large_export.py, cached outside the repo) it runs,
each in a fresh child process under ``/usr/bin/time`` (wall, user+sys CPU, peak RSS):

(a) ``nvtx-trace analyze --json OUT REPORT``: every analysis, default options;
(b) the floor: Python's ``sqlite3`` ``fetchall()`` of exactly the rows and columns the
    analyzer reads, taken from its own plan (floor_queries): every row of the kernel, memcpy
    and memset tables with the columns it keeps; NVTX range rows; the runtime calls of its one
    filtered pass (sync and copy calls, calls >= 50 us, the launches of transpose kernels and
    host-to-device copies). One thread, one query after another;
(c) ``nsys analyze COPY``: every default rule of the installed nsys, on a throw-away copy
    (nsys may add tables to the file).

It prints a markdown table with ratios and the fitted exponent b of time ~ kernels^b
(least squares on log-log; b = 1 is linear). Files are read once before timing, so all
runs see a warm page cache. On a shared machine wall time includes waiting for the CPU;
CPU time (user+sys) does not, so both are shown.

Correctness: the replicated export's busy time, gap count and idle time must equal
what replication implies (linear in the number of copies, fitted on the source and a
2-copy build) and, for the smallest size, a SQL window-function computation of the union.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_large_export import DEFAULT_CACHE, DEFAULT_SOURCE, build, cached_export  # noqa: E402

RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
GPU_TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"]


def floor_queries(path: Path) -> list[str]:
    """The analyzer's reads as plain SELECTs: every column and row it loads, taken from its own plan."""
    from nvtx_trace.analyzer import pipeline
    from nvtx_trace.analyzer.questions import REGISTRY
    from nvtx_trace.analyzer.trace.reader import GPU_OP_TABLES, RANGE_EVENT_TYPES, Reader
    from nvtx_trace.analyzer.trace.tables import PRELOAD_FILTERS, SLOW_API_NS, Trace

    reader = Reader(path)
    try:
        trace = Trace(reader)
        pipeline.announce(REGISTRY, trace)
        q = [f"SELECT {', '.join(reader.gpu_columns(key).values())} FROM {table}"
             for key, table in GPU_OP_TABLES.items() if reader.has(table)]
        q.append("SELECT start, end, globalTid, textId, domainId FROM NVTX_EVENTS "
                 f"WHERE eventType IN {RANGE_EVENT_TYPES} AND start > 0")
        ids = [i for i, n in trace.api_names.items() if any(f.search(n) for f in PRELOAD_FILTERS)]
        columns, source = reader.runtime_query(ids, SLOW_API_NS, trace._launch_requests)
        q.append(f"SELECT {', '.join(columns.values())} FROM {source}")
    finally:
        reader.close()
    return q


FLOOR_CHILD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], uri=True)
conn.execute("PRAGMA cache_size=-65536")
held = [conn.execute(q).fetchall() for q in sys.argv[2:]]
print(sum(map(len, held)))
"""


def timed(argv: list[str], timeout: float) -> dict:
    """Run argv under /usr/bin/time; wall, CPU (user+sys, children included) and peak RSS."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(["/usr/bin/time", "-o", tf.name, "-f", "%U %S %M", *argv],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "wall_s": float("nan"), "cpu_s": float("nan"), "rss_mb": float("nan"),
                    "note": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - t0
        fields = tf.read().split()
    user, sys_, rss_kb = float(fields[-3]), float(fields[-2]), int(fields[-1])
    return {"ok": proc.returncode == 0, "wall_s": wall, "cpu_s": user + sys_, "rss_mb": rss_kb / 1024,
            "stdout": proc.stdout, "stderr": proc.stderr, "rc": proc.returncode}


def best(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["ok"]] or runs
    return min(ok, key=lambda r: (r["wall_s"] if r["wall_s"] == r["wall_s"] else math.inf))


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(16 << 20):
            pass


def run_analyzer(path: Path, out: Path, timeout: float) -> dict:
    exe = shutil.which("nvtx-trace")
    argv = [exe] if exe else [sys.executable, "-m", "nvtx_trace.cli"]
    r = timed([*argv, "analyze", "--json", str(out), "--force", str(path)], timeout)
    if not r["ok"]:
        r["note"] = (r.get("stderr") or r.get("note") or "")[-300:]
    return r


def run_floor(path: Path, queries: list[str], timeout: float) -> dict:
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    r = timed([sys.executable, "-c", FLOOR_CHILD, uri, *queries], timeout)
    r["rows"] = int(r["stdout"].strip() or 0) if r["ok"] else 0
    return r


def run_nsys(path: Path, timeout: float) -> dict:
    nsys = shutil.which("nsys")
    if not nsys:
        return {"ok": False, "wall_s": float("nan"), "cpu_s": float("nan"), "rss_mb": float("nan"),
                "note": "nsys not on PATH"}
    copy = path.with_name(path.stem + ".nsys-analyze-copy.sqlite")
    shutil.copyfile(path, copy)
    try:
        warm(copy)
        r = timed([nsys, "analyze", str(copy)], timeout)
        rules = re.findall(r"Processing \[.*?\] with \[.*?/rules/([\w-]+)\.py\]", r.get("stdout", "") or "")
        r["note"] = f"rules: {', '.join(rules)}" if rules else (r.get("note") or r.get("stderr", "")[-300:])
    finally:
        copy.unlink(missing_ok=True)
        for extra in copy.parent.glob(copy.stem + "*"):
            extra.unlink(missing_ok=True)
    return r


# ---- correctness --------------------------------------------------------------------------------
CHECK_KEYS = ("busy_ns", "gap_count", "gap_idle_ns", "span_ns")


def device0(json_path: Path) -> dict:
    d = json.loads(json_path.read_text())["devices"][0]
    return {k: int(d[k]) for k in CHECK_KEYS}


def sql_union(path: Path, min_gap_ns: int = 1_000_000) -> dict:
    """Busy time (union), gaps >= min_gap and span of device 0 with a SQL window function."""
    import sqlite3

    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    ops = " UNION ALL ".join(f"SELECT deviceId AS d, start AS s, end AS e FROM {t} WHERE start > 0 AND end >= start"
                             for t in GPU_TABLES)
    row = conn.execute(f"""
        WITH w AS (SELECT d, s, e, max(e) OVER (PARTITION BY d ORDER BY s
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
                   FROM ({ops}))
        SELECT min(s), max(e), sum(CASE WHEN s > reach THEN s - reach ELSE 0 END),
               sum(s - reach >= {min_gap_ns}), sum(CASE WHEN s - reach >= {min_gap_ns} THEN s - reach ELSE 0 END)
        FROM w GROUP BY d ORDER BY d LIMIT 1""").fetchone()
    conn.close()
    lo, hi, holes, gaps, gap_idle = row
    return {"busy_ns": hi - lo - holes, "gap_count": gaps, "gap_idle_ns": gap_idle, "span_ns": hi - lo}


def predicted(source: Path, cache: Path, copies: int, tmp: Path) -> dict:
    """Device-0 figures the replication implies for ``copies`` copies: v1 + (copies - 1) * (v2 - v1)."""
    two = cache / f"{source.stem}-x2-check.sqlite"
    if not two.exists():
        build(source, two, 2, log=lambda *_: None)
    v = []
    for p in (source, two):
        out = tmp / f"{p.stem}.json"
        r = run_analyzer(p, out, 600)
        if not r["ok"]:
            raise SystemExit(f"analyzer failed on {p}: {r.get('note')}")
        v.append(device0(out))
    return {k: v[0][k] + (copies - 1) * (v[1][k] - v[0][k]) for k in CHECK_KEYS}


# ---- report -------------------------------------------------------------------------------------
def exponent(xs: list[float], ys: list[float]) -> float:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y == y and y > 0]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else float("nan")


def fmt(v: float, unit: str = "") -> str:
    return "n/a" if v != v else f"{v:,.1f}{unit}"


def ratio(a: float, b: float) -> str:
    return "n/a" if a != a or b != b or b == 0 else f"{a / b:.2f}x"


def table(rows: list[dict]) -> str:
    head = ("| kernels | file | analyzer wall / CPU / RSS | floor wall / CPU / RSS "
            "| nsys analyze wall / CPU / RSS | analyzer/floor wall (CPU) | nsys/analyzer wall (CPU) |")
    out = [head, "|" + "---|" * 7]
    for r in rows:
        a, f, n = r["analyzer"], r["floor"], r["nsys"]
        cell = lambda x: f"{fmt(x['wall_s'], ' s')} / {fmt(x['cpu_s'], ' s')} / {fmt(x['rss_mb'], ' MB')}"  # noqa: E731
        out.append(f"| {r['kernels']:,} | {r['bytes'] / 2**20:,.0f} MiB | {cell(a)} | {cell(f)} "
                   f"| {cell(n)} | {ratio(a['wall_s'], f['wall_s'])} ({ratio(a['cpu_s'], f['cpu_s'])}) "
                   f"| {ratio(n['wall_s'], a['wall_s'])} ({ratio(n['cpu_s'], a['cpu_s'])}) |")
    if len(rows) >= 2:
        ks = [r["kernels"] for r in rows]
        exps = []
        for tool in ("analyzer", "floor", "nsys"):
            e = [exponent(ks, [r[tool][m] for r in rows]) for m in ("wall_s", "cpu_s", "rss_mb")]
            exps.append(f"{tool}: time^{e[0]:.2f} (CPU^{e[1]:.2f}), RSS^{e[2]:.2f}")
        out.append("")
        out.append("Fitted exponents b in y ~ kernels^b: " + "; ".join(exps))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[1_000_000, 5_000_000, 10_000_000])
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and size; the fastest is kept")
    ap.add_argument("--no-nsys", action="store_true", help="skip nsys analyze")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--json", type=Path, help="also write the raw measurements here")
    args = ap.parse_args(argv)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
          f"load average {os.getloadavg()[0]:.2f} at start; python {platform.python_version()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for k in sorted(args.kernels):
            path, meta = cached_export(k, args.source, args.cache)
            warm(path)
            queries = floor_queries(path)
            row = {"kernels": meta["kernels"], "copies": meta["copies"], "bytes": meta["bytes"], "path": str(path)}
            out = tmp / "analysis.json"
            row["analyzer"] = best([run_analyzer(path, out, args.timeout) for _ in range(args.repeat)])
            row["floor"] = best([run_floor(path, queries, args.timeout) for _ in range(args.repeat)])
            row["nsys"] = ({"ok": False, "wall_s": float("nan"), "cpu_s": float("nan"), "rss_mb": float("nan"),
                            "note": "skipped"} if args.no_nsys else
                           best([run_nsys(path, args.timeout) for _ in range(args.repeat)]))
            for tool in ("analyzer", "floor", "nsys"):
                r = row[tool]
                print(f"  {meta['kernels']:>11,} kernels  {tool:8s} wall {fmt(r['wall_s'], ' s'):>9} "
                      f"CPU {fmt(r['cpu_s'], ' s'):>9} RSS {fmt(r['rss_mb'], ' MB'):>10}"
                      + ("" if r["ok"] else f"  FAILED: {r.get('note', '')}"), flush=True)
            if not args.no_check and row["analyzer"]["ok"]:
                got = device0(out)
                row["check"] = {"analyzer": got, "replication": predicted(args.source, args.cache, meta["copies"], tmp)}
                if k == min(args.kernels):
                    row["check"]["sql_window"] = sql_union(path)
                for name, want in row["check"].items():
                    if name != "analyzer":
                        verdict = "OK" if want == got else "MISMATCH"
                        print(f"  check vs {name}: {verdict} " + ", ".join(
                            f"{key} {got[key]:,}" + ("" if got[key] == want[key] else f" (expected {want[key]:,})")
                            for key in CHECK_KEYS), flush=True)
            for tool in ("analyzer", "floor", "nsys"):
                for key in ("stdout", "stderr"):
                    row[tool].pop(key, None)
            rows.append(row)
    print()
    print(table(rows))
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
