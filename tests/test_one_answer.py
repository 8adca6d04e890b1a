"""One answer from every door (issue 32): `nvtx-trace analyze` of the report a run wrote gives the run's own
answer. The run knows where its capture window opened (after warm-up); the report says so itself
(nvtx_autotrace's `nvtx_autotrace.window` record), so reading it again leaves out the same steps, finds the same
figures and predicts the same steps. Real runs under the real nsys 2022.4 on this CPU machine.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest
from conftest import ROOT

SKIP = {"report"}  # where the report lies: the one key that names the door


def nvtx_trace(*words, cwd, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *words], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def differences(a, b, where="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if not where and k in SKIP:
                continue
            out += differences(a.get(k), b.get(k), f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_analyze_of_a_run_s_report_gives_the_run_s_answer(tmp_path):
    from conftest import installed_nsys

    installed_nsys()
    script = ROOT / "programs" / "slow_loader_train.py"
    run = nvtx_trace("run", "--out", "r", "--no-history", str(script), "--steps", "400", cwd=tmp_path)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "after" in run.stderr and "warm-up steps" in run.stderr  # the default window left warm-up out
    # the report itself says where its window opened: one record, at the first captured step (SQL)
    with sqlite3.connect(tmp_path / "r" / "report.sqlite") as db:
        texts = [r[0] for r in db.execute("SELECT coalesce(s.value, e.text) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                                          "ON s.id = e.textId WHERE coalesce(s.value, e.text) LIKE "
                                          "'nvtx_autotrace.window %'")]
    assert len(texts) == 1
    first = json.loads(texts[0].split(" ", 1)[1])["first_step"]
    steps = summary["steps"]["summary"]
    assert steps["capture_first_step"] == first and steps["warmup_steps"] == 0
    assert summary["steps"]["table"][0]["step"] == first
    assert summary["window"]["program"] == "slow_loader_train.py"  # the page's title, from either door
    page = (tmp_path / "r" / "summary.html").read_text()
    assert "<title>nvtx-trace: slow_loader_train.py (report.sqlite)</title>" in page
    # No GPU on this machine, yet the page breaks each step down: one bar per step, its waits the steps table's.
    figures = json.loads(re.search(r'id="nvtx-trace-data">(.*?)</script>', page, re.S).group(1))["figures"]
    bars = {t["name"]: t for f in figures if f["div"] == "steps-chart" for t in f["figure"]["data"]}
    table = summary["steps"]["table"]
    assert bars["waiting for data (in the DataLoader)"]["x"] == [str(r["step"]) for r in table]
    assert [r["loader_ns"] for r in summary["step_breakdown"]] == [r["loader_wait_ns"] for r in table]
    for door in ("r/report.sqlite", "r/report.nsys-rep"):
        nvtx_trace("analyze", door, "--json", "again.json", "--force", cwd=tmp_path)
        again = json.loads((tmp_path / "again.json").read_text())
        assert differences(summary, again) == [], door
    assert [f["kind"] for f in summary["findings"]][:1] == ["dataloader_stall"]  # a finding was compared too


def agents() -> set[int]:
    """pids of the `nsys --start-agent` processes now running that the suite's nsys started (they inherit its
    mark): another user's nsys beside the suite starts its own (a loaded pass blamed one on this test)."""
    from pathlib import Path

    from conftest import carries_mark

    out = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if b"--start-agent" in (entry / "cmdline").read_bytes() and carries_mark(entry.name):
                out.add(int(entry.name))
        except OSError:
            continue
    return out


@pytest.mark.nsys
@pytest.mark.slow
def test_an_nsys_failure_is_nsys_s_and_the_program_is_not_blamed(tmp_path):
    """The real nsys refusing its options (a second --sample) fails before it starts the program: the error
    names nsys and quotes it, the program is said not to have run, no history row claims a failed program, and
    no agent is left running."""
    from conftest import installed_nsys

    installed_nsys()
    before = agents()
    db = tmp_path / "h.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", "--out", "r", "--history", str(db),
                           "--nsys-args=--sample=bogus", str(ROOT / "programs" / "slow_loader_train.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    flat = " ".join(proc.stderr.split())
    assert proc.returncode not in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "nsys failed before it started the program (status" in flat and "the program did not run" in flat
    assert "--sample" in flat  # nsys's own words
    assert "the program exited" not in flat and "step 0 loss" not in proc.stderr
    assert not db.exists() or not sqlite3.connect(db).execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
    assert agents() <= before


@pytest.mark.nsys
@pytest.mark.slow
def test_a_rank_s_nsys_failure_is_nsys_s_not_the_launcher_s(tmp_path):
    """Behind a launcher, each rank's nsys refusing its options fails before it starts the rank's program (seen
    in CI as nsys 2022.4's start-up fault under load): said as nsys's, no raw capture kept, nothing left running."""
    import shutil

    from conftest import installed_nsys

    installed_nsys()
    if shutil.which("torchrun") is None:
        pytest.skip("no torchrun")
    before = agents()
    # each rank's nsys lives a third of a second before it fails, as nsys's start-up fault under load does (one
    # refusing its options at once may end before the tool's look at the launcher's processes)
    slow = tmp_path / "bin" / "nsys"
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\nsleep 0.3\nexec {shutil.which("nsys") or "/usr/bin/nsys"} "$@"\n')
    slow.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(tmp_path / "tmp"), "NSYS": str(slow)}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", "--out", "r", "--no-history", "--full",
                           "--trace", "nvtx", "--no-autotrace", "--nsys-args=--sample=bogus", "--per-rank", "--",
                           "torchrun", "--nproc_per_node=2", str(ROOT / "programs" / "fault_program.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    flat = " ".join(proc.stderr.split())
    assert proc.returncode not in (0, 1) and "Traceback (most recent call last):\n  File" not in proc.stderr.split(
        "nvtx-trace:")[-1], proc.stderr[-2000:]
    assert "nsys failed before it started the program in any rank (the launcher's status 1)" in flat, flat[-2000:]
    assert "--sample" in flat and "the program did not run" in flat  # nsys's own words
    assert "raw capture" not in flat and "free some space" not in flat
    assert list((tmp_path / "tmp").iterdir()) == []  # no private folder of ours, no raw capture
    assert agents() <= before
