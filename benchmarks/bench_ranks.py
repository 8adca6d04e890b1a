"""Many per-rank reports, analyzed one by one, in a process pool, and on a local Dask cluster.

    python benchmarks/bench_ranks.py                     # N = 2, 8, 32 ranks
    python benchmarks/bench_ranks.py --ranks 4 16 --dask-workers 2 --json out.json

The rank reports are built from the real two-rank DDP capture (sample_reports/resnet_ddp_flawed.sqlite,
two H200s, one report holding both ranks): it is split into one report per process
(tests/rank_files.py), then N - 1 copies of the fast rank's report and one copy of the slow rank's
(the planted straggler: the real rank the other waited for, which waits 1.34 s for its data loader
in the steady window against the fast rank's 1.03 s) are written, each with its own GPU id and
pids, as `nsys profile -o rank%q{RANK}` on one host would write them. Every copy keeps the
session of the original, so the clocks are shared.

Each mode runs in a fresh child process (`nvtx-trace analyze --json`), page cache warm:

    one by one   --workers 1   every report read in the main process, one after the other
    pool         (default)     a local process pool, one worker per core
    dask         --scheduler local:W   a local Dask cluster of W worker processes

Wall time, and peak memory sampled every 20 ms over the child's process tree (psutil): the
largest single process (the main one, or the largest worker) and the whole tree together.
Correctness, printed for every N: the three modes' summaries are identical, and the straggler
finding names the planted rank's GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from rank_files import ddp_rank_groups, split_by_process  # noqa: E402

SOURCE = ROOT / "sample_reports" / "resnet_ddp_flawed.sqlite"
GLOBAL_KEYS = ("globalTid", "globalPid")
PLAIN_KEYS = ("pid", "processId")
DEVICE_KEYS = ("deviceId", "srcDeviceId", "dstDeviceId")


def _retag(path: Path, device: int, pid_step: int) -> None:
    """Give a rank report its own GPU id and pids (as another rank of the job would have)."""
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    for table in tables:
        for col in [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]:
            if col in GLOBAL_KEYS:
                conn.execute(f"UPDATE {table} SET {col} = {col} + ({pid_step} << 24) WHERE {col} > 0")
            elif col in PLAIN_KEYS:
                conn.execute(f"UPDATE {table} SET {col} = {col} + {pid_step} WHERE {col} > 0")
            elif col in DEVICE_KEYS and table.startswith("CUPTI_"):
                conn.execute(f"UPDATE {table} SET {col} = {device} WHERE {col} IS NOT NULL")
    conn.execute("DELETE FROM TARGET_INFO_GPU WHERE id <> (SELECT min(id) FROM TARGET_INFO_GPU)")
    conn.execute("UPDATE TARGET_INFO_GPU SET id = ?", (device,))
    conn.commit()
    conn.close()


def build_ranks(n: int, out: Path, base: Path) -> list[Path]:
    """N rank reports: rank 0 is the slow (planted) one, ranks 1.. copies of the fast one."""
    slow, fast = base / "slow.sqlite", base / "fast.sqlite"
    paths = []
    for k in range(n):
        dst = out / f"rank{k}.sqlite"
        shutil.copyfile(slow if k == 0 else fast, dst)
        _retag(dst, k, 1000 * (k + 1))
        paths.append(dst)
    return paths


def split_source(base: Path) -> None:
    rank0, rank1 = ddp_rank_groups(SOURCE)
    pids = set(rank0) | set(rank1)
    others = {p for (p,) in sqlite3.connect(f"file:{SOURCE}?mode=ro", uri=True).execute(
        "SELECT DISTINCT globalPid >> 24 & 16777215 FROM PROCESSES")} - pids
    # the launcher and system processes go to a third file; the rank files hold their own processes only
    files = split_by_process(SOURCE, base, [others, rank0, rank1])
    files[1].rename(base / "slow.sqlite")  # GPU 0's rank: the one the other waits for
    files[2].rename(base / "fast.sqlite")


def measure(cmd: list[str], env: dict) -> dict:
    """Wall time and peak RSS (largest process, whole tree) of a child process and its descendants."""
    import psutil

    peak = {"max_process": 0, "tree": 0}
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(child.pid)
        while not done.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = []
                for p in procs:
                    try:
                        rss.append(p.memory_info().rss)
                    except psutil.Error:
                        pass
                peak["max_process"] = max(peak["max_process"], max(rss, default=0))
                peak["tree"] = max(peak["tree"], sum(rss))
            except psutil.Error:
                pass
            done.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, err = child.communicate()
    done.set()
    thread.join()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return {"wall_s": time.perf_counter() - start, **peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--dask-workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nvtx-trace-ranks-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    results = []
    try:
        base = work / "base"
        base.mkdir()
        split_source(base)
        print(f"{os.cpu_count()} cores, Python {platform.python_version()}, Dask workers {args.dask_workers}; "
              f"source {SOURCE.name}", flush=True)
        print("| ranks | files | one by one | process pool | local Dask | speed-up pool, Dask | "
              "largest process: one by one / pool / Dask | whole tree: one by one / pool / Dask |")
        print("|---|---|---|---|---|---|---|---|")
        for n in args.ranks:
            folder = work / f"n{n}"
            folder.mkdir()
            paths = build_ranks(n, folder, base)
            size = sum(p.stat().st_size for p in paths)
            for p in paths:
                p.read_bytes()  # warm the page cache
            modes = {"serial": ["--workers", "1"], "pool": [],
                     "dask": ["--scheduler", f"local:{args.dask_workers}"]}
            row, summaries = {"ranks": n, "bytes": size}, {}
            for mode, extra in modes.items():
                out = folder / f"{mode}.json"
                cmd = [sys.executable, "-m", "nvtx_trace.cli", "analyze", str(folder), "--json", str(out),
                       *extra]
                row[mode] = measure(cmd, env)
                summaries[mode] = json.loads(out.read_text())
            same = all(_comparable(s) == _comparable(summaries["serial"]) for s in summaries.values())
            straggler = next((f for f in summaries["serial"]["findings"] if f["kind"] == "straggler"), None)
            row["identical"], row["straggler_device"] = same, straggler and straggler["evidence"]["slow_device_id"]
            results.append(row)
            s, p, d = (row[m] for m in ("serial", "pool", "dask"))
            print(f"| {n} | {size / 2**20:.0f} MiB | {s['wall_s']:.1f} s | {p['wall_s']:.1f} s | {d['wall_s']:.1f} s "
                  f"| {s['wall_s'] / p['wall_s']:.2f}x, {s['wall_s'] / d['wall_s']:.2f}x "
                  f"| {_mb(s['max_process'])} / {_mb(p['max_process'])} / {_mb(d['max_process'])} "
                  f"| {_mb(s['tree'])} / {_mb(p['tree'])} / {_mb(d['tree'])} |", flush=True)
            print(f"  check: the three summaries are {'identical' if same else 'DIFFERENT'}; straggler on GPU "
                  f"{row['straggler_device']} (planted: GPU 0)", flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _comparable(summary: dict) -> dict:
    """The summary without what names the run rather than the analysis (tool version, paths)."""
    return {k: v for k, v in summary.items() if k not in ("tool",)}


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


if __name__ == "__main__":
    main()
