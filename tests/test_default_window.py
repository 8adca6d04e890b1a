"""The default of `nvtx-trace run` under the real nsys on this machine: a window the program picks after
warm-up, then it is stopped. A script that would run for minutes answers within seconds of its window; a
script that ends during warm-up is profiled again in full; a loop with no training step gets a time window."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import time

import pytest
from conftest import end_tree
from test_run import SCRIPTS, SLOW, WAIT, ranges_by_pid, ready, step_ranges  # noqa: F401  (ready: the nsys/torch/nvtx fixture)

from nvtx_trace import runner
from nvtx_trace.capture.nsys_log import LOG_NAME

try:
    from nvtx_autotrace import auto_window
except ImportError:  # no torch here: every test below needs it and the `ready` fixture skips (fails under CI=true)
    auto_window = None

WINDOW_LINE = re.compile(r"nvtx-trace: profiled steps (\d+)-(\d+) \((\d+) steps, ([\d.]+) s\) after (\d+) warm-up "
                         r"steps: (.*?); the program was stopped after them")


def timed_run(args: list[str], cwd) -> tuple[int, str, str, dict[str, float]]:
    """Run the CLI; returns (exit code, stdout, stderr, when marker lines appeared, in s from the start)."""
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "run", *args], cwd=cwd, text=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen, when = [], {}
    try:
        for line in child.stderr:
            seen.append(line)
            if line.startswith("nvtx-trace: the program was stopped"):
                when["stopped"] = time.monotonic() - started
        out = child.stdout.read()
        child.wait(timeout=300)
    finally:
        end_tree(child)
    when["returned"] = time.monotonic() - started
    return child.returncode, out, "".join(seen), when


@pytest.fixture(scope="module")
def long_run(ready, tmp_path_factory):  # noqa: F811
    """20000 steps of at least 16 ms each: five minutes and more if nothing stopped it."""
    work = tmp_path_factory.mktemp("long")
    code, out, err, when = timed_run(["--out", "out", "--trace", "nvtx", str(SLOW), "--steps", "20000",
                                      "--workers", "0"], work)
    return code, out, err, when, work / "out"


def test_a_long_script_answers_within_seconds_of_its_window(long_run):
    code, out, err, when, _ = long_run
    assert code == 0, err[-3000:]
    assert "stopped" in when, err[-3000:]
    assert "step 19999" not in err and "done" not in out  # the program did not run to its end
    assert when["returned"] - when["stopped"] < 60, when  # export and analysis of the window only
    assert when["returned"] < 120, when  # the answer within about two minutes of the start


def test_the_report_holds_only_the_window_steps_the_line_names(long_run):
    code, _, err, _, folder = long_run
    match = WINDOW_LINE.search(" ".join(err.split()))
    assert match, err[-3000:]
    first, last, count, seconds, warmup = (int(match[1]), int(match[2]), int(match[3]), float(match[4]),
                                           int(match[5]))
    assert warmup == first >= auto_window.MIN_WARMUP and count == last - first + 1 >= auto_window.MIN_STEPS
    assert step_ranges(folder / "report.sqlite") == [f"step {i}" for i in range(first, last + 1)]
    summary = json.loads((folder / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]["table"]] == list(range(first, last + 1))
    assert summary["steps"]["summary"]["warmup_steps"] == 0  # the window already left warm-up out
    # the seconds it names, against plain SQL over the export: from step `first`'s start to step `last`'s end
    with sqlite3.connect(folder / "report.sqlite") as db:
        span = db.execute("SELECT max(e.end) - min(e.start) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                          "ON s.id = e.textId WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*'").fetchone()[0]
    assert span / 1e9 == pytest.approx(seconds, rel=0.05, abs=0.05)
    assert seconds >= auto_window.MIN_SECONDS


def test_a_script_that_ends_during_warm_up_is_profiled_again_in_full(ready, tmp_path):  # noqa: F811
    code, out, err, _ = timed_run(["--out", "out", "--trace", "nvtx", str(SLOW), "--steps", "6"], tmp_path)
    assert code == 0, err[-3000:]
    flat = " ".join(err.split())
    assert "the program ended after 6 step(s)" in flat and "during warm-up" in flat
    assert "it runs again, profiled in full (--full)" in flat  # the notice before it runs again
    assert "so it was run again, profiled in full (--full)" in flat  # and the line with the report
    assert out.splitlines().count("done") == 2 and err.count("step 5 loss") == 2  # it ran twice, said so
    assert step_ranges(tmp_path / "out" / "report.sqlite")[:5] == [f"step {i}" for i in range(5)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*runner.OUTPUT_NAMES, LOG_NAME])
    assert (tmp_path / "out" / LOG_NAME).read_text().count("== nsys profile ==") == 2  # both runs' nsys output


def test_a_loop_without_training_steps_gets_a_time_window_then_is_stopped(ready, tmp_path):  # noqa: F811
    code, out, err, when = timed_run(["--out", "out", "--trace", "nvtx", str(SCRIPTS / "no_step_loop.py")],
                                     tmp_path)
    assert code == 0, err[-3000:]
    flat = " ".join(err.split())
    assert f"no training step was seen in the first {auto_window.NO_STEP_S:.0f} s" in flat
    assert "the program was stopped after its" in flat and "done" not in out
    assert when["returned"] < auto_window.NO_STEP_S + auto_window.MAX_SECONDS + 180  # (never stopped: 600 s)
    # what was captured spans the time window (plain SQL over the batch-wait ranges)
    with sqlite3.connect(tmp_path / "out" / "report.sqlite") as db:
        span = db.execute("SELECT max(end) - min(start) FROM NVTX_EVENTS WHERE end IS NOT NULL").fetchone()[0]
    assert auto_window.MAX_SECONDS - 1 <= span / 1e9 <= auto_window.MAX_SECONDS + 5
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["steps"] or {}).get("source") != "nvtx"  # no step ranges: inferred (or none on a noisy host)
    # the answer covers the window's batch waits: as many as plain SQL counts in the export
    waits = ranges_by_pid(tmp_path / "out" / "report.sqlite", WAIT)
    assert sum(waits.values()) > 100 and summary["dataloader"]["loaders"][0]["waits"] == sum(waits.values())


def test_torchrun_ranks_use_the_same_fixed_window_and_all_stop(ready, tmp_path):  # noqa: F811
    """Ranks cannot agree on a time: each uses the fixed step counts, so all stop after the same step and
    none waits in a collective; torchrun's own process (no steps) arms nothing and is not stopped."""
    import os
    import shutil

    from conftest import need

    need("torchrun", shutil.which("torchrun") is not None)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    child = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", "--out", "out", "--trace", "nvtx", "--",
                            "torchrun", "--nproc_per_node=2", str(SCRIPTS / "ddp_gloo_cpu_train.py"), "--steps", "400"],
                           cwd=tmp_path, env=env, text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=400)
    assert child.returncode == 0, child.stderr[-3000:]
    first, last = auto_window.DIST_WARMUP, auto_window.DIST_WARMUP + auto_window.DIST_STEPS - 1
    assert child.stderr.count(f"the program was stopped after step {last}:") == 2  # one line per rank
    assert " done " not in child.stdout  # neither rank ran its 400 steps
    flat = " ".join(child.stderr.split())
    assert f"profiled steps {first}-{last} ({auto_window.DIST_STEPS} steps" in flat and "distributed run" in flat
    db = tmp_path / "out" / "report.sqlite"
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT (e.globalTid >> 24) & 16777215, coalesce(e.text, s.value) FROM NVTX_EVENTS e "
                           "LEFT JOIN StringIds s ON s.id = e.textId WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*' "
                           "ORDER BY e.start").fetchall()
    per_rank: dict[int, list[str]] = {}
    for pid, name in rows:
        per_rank.setdefault(pid, []).append(name)
    assert len(per_rank) == 2 and all(v == [f"step {i}" for i in range(first, last + 1)] for v in per_rank.values())


def test_a_script_that_fails_during_warm_up_says_nothing_was_profiled_and_keeps_its_exit_code(ready, tmp_path):  # noqa: F811
    code, _, err, _ = timed_run(["--out", "out", "--trace", "nvtx", str(SLOW), "--raise-at", "3"], tmp_path)
    assert code == 1, err[-3000:]  # the program's exit code, not ours
    flat = " ".join(err.split())
    assert "RuntimeError: deliberate failure at step 3" in flat  # the program's own traceback
    assert "the program ended (status 1) after 3 step(s)" in flat and "nothing was profiled" in flat
    assert "nvtx-trace run --full" in flat and not re.search(r'File ".*nvtx_trace/', err)  # no traceback of ours
    # no report exists, so nothing claims one (issue 32: "the report covers what ran until then" contradicted it)
    assert "no report was written" in flat and "the report covers" not in flat
    assert flat.count("before the default window opened") == 1  # said once
    assert err.count("deliberate failure") == 2  # the message and its traceback line: the program ran once
