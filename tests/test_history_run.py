"""Run history end to end: a real `nvtx-trace run` of a small script under the real nsys, twice (from a git
repository, changed in between), then `nvtx-trace history` shows both rows, and the second run printed one
line of what changed since the first."""

from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, installed_nsys, need

from nvtx_trace.units import ms

SCRIPT = ROOT / "programs" / "slow_loader_train.py"


def cli(args: list[str], cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *args], cwd=cwd, text=True, env=env,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=300)


def sql_step_median(db) -> float:
    """Independent of the analyzer: the median length of the `step N` ranges in the export."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT e.end - e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                           "WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*' AND e.end IS NOT NULL").fetchall()
    return statistics.median(r[0] for r in rows)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    import importlib.util
    import os

    installed_nsys()
    need("PyTorch and nvtx", importlib.util.find_spec("torch") is not None and importlib.util.find_spec("nvtx"))
    need("git", shutil.which("git") is not None)
    repo = tmp_path_factory.mktemp("repo")
    shutil.copy(SCRIPT, repo / "train.py")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "first"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    env = dict(os.environ, NVTX_TRACE_HISTORY=str(repo.parent / "runs.db"))
    window = ["--trace", "nvtx", "--warmup-steps", "5", "--steps", "8"]
    first = cli(["run", "--out", "one", *window, "train.py", "--steps", "3000", "--workers", "0"], repo, env)
    with open(repo / "train.py", "a") as fh:
        fh.write("# changed: more workers\n")
    second = cli(["run", "--out", "two", *window, "train.py", "--steps", "3000", "--workers", "2"], repo, env)
    listed = cli(["history", "--json"], repo, env)
    return repo, first, second, listed


def test_history_shows_both_runs_with_the_summaries_step_medians(two_runs):
    repo, first, second, listed = two_runs
    assert first.returncode == 0, first.stderr[-3000:]
    assert second.returncode == 0, second.stderr[-3000:]
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)["runs"]
    assert [r["out_dir"] for r in runs] == [str(repo / "two"), str(repo / "one")]  # newest first
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert [(r["git_commit"], r["git_dirty"]) for r in runs] == [(commit, True), (commit, False)]
    assert [r["knobs"] for r in runs] == [{"num_workers": 2}, {"num_workers": 0}]
    assert all(r["script"] == str((repo / "train.py").resolve()) and r["exit_code"] == 0 for r in runs)
    for run, folder in zip(runs, ("two", "one")):
        summary = json.loads((repo / folder / "summary.json").read_text())
        assert run["step_ns_median"] == summary["steps"]["summary"]["step_ns_median"]
        assert run["steps"] == 8
        # and the summary's median against plain SQL over the export (the window holds only steady steps)
        assert run["step_ns_median"] == pytest.approx(sql_step_median(repo / folder / "report.sqlite"), rel=0.02)
        assert [f["kind"] for f in run["findings"]] == [f["kind"] for f in summary["findings"]]


def test_the_second_run_prints_one_line_of_what_changed(two_runs):
    repo, first, second, listed = two_runs
    assert "since the last run of this script" not in first.stderr
    flat = " ".join(second.stderr.split())
    lines = [line for line in second.stderr.splitlines() if "since the last run of this script" in line]
    assert len(lines) == 1, second.stderr[-3000:]
    runs = json.loads(listed.stdout)["runs"]
    # the median, or the mean where either run's steps come in two kinds or are uneven (mean >= 1.15 x median,
    # as docs/json-schema.md says): workers=2 on a loaded host can do either
    def uneven(r):
        return r["step_modes"] not in (None, "null") or r["step_ns_mean"] >= 1.15 * r["step_ns_median"]
    stat = "mean" if any(uneven(r) for r in runs) else "median"
    b_ns, a_ns = runs[1][f"step_ns_{stat}"], runs[0][f"step_ns_{stat}"]
    assert f"step {ms(b_ns)} -> {ms(a_ns)} ({(a_ns - b_ns) / b_ns:+.0%}, {stat})" in flat
    assert str(repo / "one") in flat


def test_a_history_that_cannot_be_written_costs_one_warning_line_not_the_run(two_runs, tmp_path):
    repo = two_runs[0]
    garbage = tmp_path / "not-a-db"
    garbage.write_bytes(b"\x00garbage" * 512)
    proc = cli(["run", "--out", str(tmp_path / "three"), "--history", str(garbage), "--trace", "nvtx",
                "--warmup-steps", "5", "--steps", "3", "train.py", "--steps", "3000", "--workers", "0"], repo, None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("nvtx-trace: warning: history")]
    assert len(warnings) == 1 and "not a usable SQLite database" in warnings[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and (tmp_path / "three" / "summary.json").is_file()
    assert garbage.read_bytes() == b"\x00garbage" * 512  # left as it was
