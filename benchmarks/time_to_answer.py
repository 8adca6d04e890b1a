"""How long a user waits for an answer: `nvtx-trace run` with its default window against `--full`.

    python benchmarks/time_to_answer.py programs/slow_loader_train.py --steps 3000 --workers 0
    python benchmarks/time_to_answer.py --full-too programs/resnet50_train.py --steps 650 --workers 2

For each configuration (default, and with ``--full-too`` also ``--full``), one process, it prints the
wall time from start to answer, when the program was stopped (default: the window line's time), the
export-and-analysis tail after that, the steps and kernels in the report (plain SQL over the export),
and the line saying what was profiled. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(config: str, program: list[str], nsys: str | None, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="tta-") as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "nvtx_trace.cli", "run", "--no-history", "--out", str(out), *extra]
        cmd += ["--full"] if config == "full" else []
        cmd += ["--nsys", nsys] if nsys else []
        started = time.monotonic()
        child = subprocess.Popen([*cmd, *program], text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        stopped, window, tail = None, None, []
        for line in child.stderr:
            tail = (tail + [line])[-40:]
            if line.startswith("nvtx-trace: the program was stopped"):
                stopped = time.monotonic() - started
        child.stdout.read()
        code = child.wait()
        wall = time.monotonic() - started
        flat = " ".join("".join(tail).split())
        match = re.search(r"nvtx-trace: (profiled .*?)(?= Wrote |$)", flat)
        window = match[1] if match else None
        row = {"config": config, "rc": code, "wall_s": round(wall, 1),
               "stopped_at_s": round(stopped, 1) if stopped else None,
               "after_stop_s": round(wall - stopped, 1) if stopped else None, "window": window}
        db = out / "report.sqlite"
        if db.exists():
            with sqlite3.connect(db) as con:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                row["kernels"] = (con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
                                  if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else 0)
                row["step_ranges"] = con.execute(
                    "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                    "WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*'").fetchone()[0]
            summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
            row["step_ns_median"] = ((summary.get("steps") or {}).get("summary") or {}).get("step_ns_median")
        else:
            row["tail"] = flat[-600:]
        return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full-too", action="store_true", help="also time --full (the whole program)")
    p.add_argument("--nsys", default=None)
    p.add_argument("--run-args", default="", help="extra nvtx-trace run options, e.g. '--trace nvtx'")
    p.add_argument("program", nargs=argparse.REMAINDER, help="script and its arguments")
    args = p.parse_args()
    extra = args.run_args.split()
    for config in ["default"] + (["full"] if args.full_too else []):
        print(json.dumps(run(config, args.program, args.nsys, extra)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
