"""`nvtx-trace run` end to end, under the real nsys on this machine (no mocks of nsys).

Each real run costs 15-50 s on 2 cores (most of it nsys), so runs are module-scoped
fixtures shared by the assertions about them: a default run of a training loop with a
slow dataset, a crashing run, a capture-window run of a module that exits 3, an
interrupted run and a torchrun run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, ctrl_c_when, installed_nsys, need

from nvtx_trace import runner
from nvtx_trace.capture import INJECT_DIR, export, locate
from nvtx_trace.capture.nsys_log import LOG_NAME
from nvtx_trace.capture.python_facts import torch_has_cuda
from nvtx_trace.errors import NsysNotFoundError, UsageError
from nvtx_trace.runner import plan as run_plan

SCRIPTS = ROOT / "programs"
SLOW = SCRIPTS / "slow_loader_train.py"
FETCH = "dataloader.fetch %"
WAIT = "dataloader.next %"


@pytest.fixture(scope="module")
def ready() -> locate.Nsys:
    """nsys, torch and an nvtx release this nsys records; skip (fail under CI) otherwise."""
    found = installed_nsys()
    need("PyTorch", importlib.util.find_spec("torch") is not None)
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    import importlib.metadata as md

    problem = locate.nvtx_problem(md.version("nvtx"), found.version)
    need(f"an nvtx release recorded by nsys {found.version} ({problem})", problem is None)
    return found


def cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", *args], cwd=cwd, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=300, **kw)


def sql(db: Path, query: str, *params) -> list[tuple]:
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


def ranges_by_pid(db: Path, like: str) -> dict[int, int]:
    """Count of NVTX ranges whose name matches ``like``, per process id (plain SQL on the export)."""
    rows = sql(db, "SELECT (n.globalTid >> 24) & 16777215, count(*) FROM NVTX_EVENTS n "
                   "LEFT JOIN StringIds s ON s.id = n.textId WHERE COALESCE(s.value, n.text) LIKE ? "
                   "AND n.end IS NOT NULL GROUP BY 1", like)
    return dict(rows)


def step_ranges(db: Path) -> list[str]:
    rows = sql(db, "SELECT COALESCE(s.value, n.text) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                   "WHERE COALESCE(s.value, n.text) LIKE 'step %' ORDER BY n.start")
    return [r[0] for r in rows]


# ---------------------------------------------------------------- the default run


@pytest.fixture(scope="module")
def slow_run(ready, tmp_path_factory):
    """nvtx-trace run --full (the whole run, otherwise the default options) on a loop that waits for a slow
    dataset; the default window has its own tests (test_default_window.py)."""
    work = tmp_path_factory.mktemp("slow")
    t0 = time.monotonic()
    proc = cli(["--full", str(SLOW), "--steps", "12"], cwd=work)
    runs = list((work / runner.DEFAULT_OUT_ROOT).glob("slow_loader_train-*"))
    return proc, runs, time.monotonic() - t0


def test_run_writes_four_outputs_into_a_fresh_folder_named_from_the_script(slow_run):
    proc, runs, _ = slow_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(runs) == 1, runs
    names = sorted(p.name for p in runs[0].iterdir())
    assert names == sorted([*runner.OUTPUT_NAMES, LOG_NAME]), names  # the .qdstrm is gone once imported
    assert export.is_sqlite(runs[0] / "report.sqlite")
    for name in runner.OUTPUT_NAMES:
        assert f"Wrote {runner.DEFAULT_OUT_ROOT}/{runs[0].name}/{name}" in proc.stderr
    assert f"Next: open {runner.DEFAULT_OUT_ROOT}/{runs[0].name}/summary.html" in proc.stderr


def test_run_passes_the_program_its_arguments_and_output(slow_run):
    proc, _, _ = slow_run
    assert "done" in proc.stdout.splitlines()
    assert "step 11 loss" in proc.stderr and "step 12 loss" not in proc.stderr


def test_run_traces_training_apis_without_cpu_sampling_and_follows_forked_workers(slow_run, ready):
    proc, _, _ = slow_run
    cmd = next(line for line in proc.stderr.splitlines() if line.startswith("$ "))
    for option in ("-s none", "--cpuctxsw none", "--trace-fork-before-exec=true", "-m nvtx_autotrace"):
        assert option in cmd, option
    expected = ",".join(locate.pick_traces(ready, runner.TRAINING_TRACES))
    assert f"-t {expected} " in cmd


def test_findings_show_a_dataloader_stall_with_per_worker_fetch_timings(slow_run):
    proc, runs, _ = slow_run
    summary = json.loads((runs[0] / "summary.json").read_text())
    kinds = [f["kind"] for f in summary["findings"]]
    assert kinds and kinds[0] == "dataloader_stall", kinds
    assert "dataloader_stall" in proc.stdout
    workers = summary["dataloader"]["workers"]
    assert sorted(w["worker"] for w in workers) == [0, 1]
    assert all(w["fetches"] > 0 and w["fetch_ns_median"] > 3_000_000 for w in workers), workers  # 4 x 4 ms


def test_worker_fetch_counts_match_plain_sql_per_worker_pid(slow_run):
    _, runs, _ = slow_run
    db = runs[0] / "report.sqlite"
    summary = json.loads((runs[0] / "summary.json").read_text())
    by_pid = ranges_by_pid(db, FETCH)
    # 12 batches, each worker under its own pid (a worker's last range can be lost at shutdown)
    assert len(by_pid) == 2 and 10 <= sum(by_pid.values()) <= 12, by_pid
    assert {w["pid"]: w["fetches"] for w in summary["dataloader"]["workers"]} == by_pid
    waits = ranges_by_pid(db, WAIT)
    assert len(waits) == 1 and set(waits).isdisjoint(by_pid)  # waits in the training process only
    assert summary["dataloader"]["loaders"][0]["waits"] == sum(waits.values())


def test_report_is_analyzed_without_gpu_analyses(slow_run):
    _, runs, _ = slow_run
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert {"gpu_idle", "layout_transpose", "pageable_h2d"} <= set(summary["skipped"])
    html = (runs[0] / "summary.html").read_text()
    assert "dataloader_stall" in html


# ---------------------------------------------------------------- a program that fails


@pytest.fixture(scope="module")
def crashed_run(ready, tmp_path_factory):
    work = tmp_path_factory.mktemp("crash")
    proc = cli(["--out", "out", "--trace", "nvtx", "--full", str(SLOW), "--raise-at", "5"], cwd=work)
    return proc, work / "out"


def test_a_crashing_script_exit_code_is_ours_and_the_partial_report_is_analyzed(crashed_run):
    proc, out = crashed_run
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "RuntimeError: deliberate failure at step 5" in proc.stderr
    assert "Traceback" in proc.stderr and not re.search(r'File ".*nvtx_trace/', proc.stderr)  # the program's
    summary = json.loads((out / "summary.json").read_text())
    steps = [s["step"] for s in summary["steps"]["table"]]
    assert steps[:5] == [0, 1, 2, 3, 4], steps
    assert step_ranges(out / "report.sqlite")[:5] == [f"step {i}" for i in range(5)]
    assert "exited with status 1" in proc.stderr


def test_out_folder_with_outputs_is_not_overwritten_without_force(crashed_run):
    _, out = crashed_run
    before = (out / "summary.json").stat().st_mtime_ns
    proc = cli(["--out", str(out), str(SLOW)], cwd=out.parent)
    assert proc.returncode == 2 and "--force" in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "summary.json").stat().st_mtime_ns == before


# ---------------------------------------------------------------- capture window, -m, exit code 3


@pytest.fixture(scope="module")
def window_run(ready, tmp_path_factory):
    """-m module run profiling steps 6-8 of 12 (module ranges settle at step 3, steps 3-5 are timed as the
    reference outside the window); the program then exits with 3."""
    out = tmp_path_factory.mktemp("window") / "out"
    proc = cli(["--out", str(out), "--trace", "nvtx", "--warmup-steps", "6", "--steps", "3", "--keep-running",
                "-m", "slow_loader_train", "--steps", "12", "--workers", "0", "--exit-code", "3"], cwd=SCRIPTS)
    return proc, out


def test_module_run_passes_the_exit_code_through(window_run):
    proc, out = window_run
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "step 11 loss" in proc.stderr  # the program ran to its end after the window closed
    assert (out / "summary.json").exists() and (out / "summary.html").exists()


def test_capture_window_holds_exactly_the_asked_steps(window_run):
    proc, out = window_run
    assert "profiling steps 6-8 only" in " ".join(proc.stderr.split())
    assert step_ranges(out / "report.sqlite") == ["step 6", "step 7", "step 8"]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]["table"]] == [6, 7, 8]
    assert summary["steps"]["summary"]["warmup_steps"] == 0  # the window already skipped warm-up
    # the budget's record, measured before the window opened, is repeated inside it
    assert summary["instrumentation"]["cost_ns_per_step"] is not None
    waits = ranges_by_pid(out / "report.sqlite", WAIT)
    assert sum(waits.values()) <= 4, waits  # batches of steps 6-8 (+ the one in flight at the edge)


def test_a_window_run_stops_the_program_after_the_window_by_default(ready, tmp_path):
    """A training script that would run 3000 steps returns within seconds of its window, exit code 0."""
    started = time.time()
    proc = cli(["--out", str(tmp_path / "out"), "--trace", "nvtx", "--warmup-steps", "4", "--steps", "2",
                str(SLOW), "--steps", "3000", "--workers", "0"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flat = " ".join(proc.stderr.split())
    assert "the program was stopped after step 5" in flat and "--keep-running" in flat
    assert "step 6 loss" not in proc.stderr and "step 2999" not in proc.stderr
    assert step_ranges(tmp_path / "out" / "report.sqlite") == ["step 4", "step 5"]
    assert time.time() - started < 120  # 3000 steps of 16 ms would take minutes


def test_profiler_cost_is_measured_against_the_steps_just_before_the_window(window_run):
    """The process times steps 3-5 (ranges chosen, no capture yet); checked against the script's own step
    times, and the profiler's cost against an independent SQL median of the captured step ranges."""
    proc, out = window_run
    own = {int(m[0]): float(m[1]) for m in re.findall(r"step (\d+) loss \S+ ms ([\d.]+)", proc.stderr)}
    summary = json.loads((out / "summary.json").read_text())
    inst, prof = summary["instrumentation"], summary["profiler"]
    assert inst["settings"]["outside_capture_steps"] == 3
    # the script times each step from the end of one optimizer.step to the next, as the step counter does;
    # its step 2 holds the calibration and its step 5 the capture start (after the process's own last mark).
    # The median of the process's three (3, 4 and 5 up to its mark) lies between its 3 and 4, which the script
    # timed too, whatever the third: a busy machine's steps differ (17.6 and 28.1 ms beside a CPU burner, where
    # their mean missed the median by 23 %)
    low, high = sorted([own[3] * 1e6, own[4] * 1e6])
    assert low * 0.85 - 1e6 <= prof["outside_capture_step_ns"] <= high * 1.15 + 1e6, (own, prof)
    with sqlite3.connect(out / "report.sqlite") as db:
        name = "coalesce(e.text, s.value)"
        steps = db.execute(f"SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                           f"WHERE {name} GLOB 'step [0-9]*'").fetchall()
        waits = db.execute(f"SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                           f"WHERE {name} GLOB 'dataloader.next *' AND e.end IS NOT NULL").fetchall()
    # each step less its waits for data: those are the loader's, which tracing does not cause (issue 41)
    own_time = [(b - a) - sum(max(0, min(e, b) - max(s, a)) for s, e in waits if e > a and s < b) for a, b in steps]
    captured = statistics.median(own_time)
    diff = captured - prof["outside_capture_step_ns"]  # the ranges ran in both
    # claimed only where tracing can explain it: <= 30 µs per traced event (no GPU here: the ranges only), and
    # not at all when the captured steps ran faster (issue 32: "0.0 µs is nsys's own tracing" said nothing true)
    if abs(diff) <= 1e3:
        assert prof["cost_ns_per_step"] is None or prof["cost_ns_per_step"] == pytest.approx(max(diff, 0), abs=1e3)
    elif 0 < diff <= inst["ranges_per_step"] * 30e3:
        assert prof["cost_ns_per_step"] == pytest.approx(diff, abs=1e3)
    else:
        assert prof["cost_ns_per_step"] is None


# ---------------------------------------------------------------- Ctrl-C


@pytest.fixture(scope="module")
def interrupted_run(ready, tmp_path_factory):
    work = tmp_path_factory.mktemp("ctrlc")
    child = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "run", "--out", "out", "--trace", "nvtx",
                              "--full", str(SLOW), "--steps", "3000"], cwd=work, text=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, err = ctrl_c_when(child, "step 15 ", timeout=240)
    return child.returncode, out, err, work / "out"


def test_ctrl_c_stops_the_program_and_still_finalizes_the_report(interrupted_run):
    code, out, err, folder = interrupted_run
    assert code == 130, err[-3000:]
    assert "was interrupted" in err
    assert sorted(p.name for p in folder.iterdir()) == sorted([*runner.OUTPUT_NAMES, LOG_NAME])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"]["summary"]["steps"] >= 15
    assert "step 2999 loss" not in err


# ---------------------------------------------------------------- torchrun


@pytest.fixture(scope="module")
def torchrun_run(ready, tmp_path_factory):
    import shutil

    need("torchrun", shutil.which("torchrun") is not None)
    work = tmp_path_factory.mktemp("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = cli(["--out", "out", "--trace", "nvtx", "--full", "--", "torchrun", "--nproc_per_node=2",
                str(SCRIPTS / "ddp_gloo_cpu_train.py")], cwd=work, env=env)
    return proc, work / "out"


def test_torchrun_ranks_and_their_workers_get_autotrace_ranges(torchrun_run):
    proc, out = torchrun_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    db = out / "report.sqlite"
    steps = ranges_by_pid(db, "step %")
    fetches = ranges_by_pid(db, FETCH)
    assert len(steps) == 2 and all(n >= 6 for n in steps.values()), steps  # one training process per rank
    # 6 batches per rank; a worker's last range is sometimes lost when the loader shuts it down
    assert len(fetches) == 2 and all(4 <= n <= 6 for n in fetches.values()), fetches
    assert set(fetches).isdisjoint(steps)
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["dataloader"]["workers"]) == 2


# ---------------------------------------------------------------- no nsys


def test_no_nsys_anywhere_is_one_line_with_the_install_hint(monkeypatch, capsys, tmp_path):
    from nvtx_trace import cli as cli_mod

    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr(locate, "KNOWN_LOCATIONS", ())
    monkeypatch.chdir(tmp_path)
    code = cli_mod.main(["run", str(SLOW)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == NsysNotFoundError.exit_code != 0
    assert len(err) == 1 and "nsight-systems" in err[0] and err[0].startswith("nvtx-trace: error:"), err
    assert not (tmp_path / runner.DEFAULT_OUT_ROOT).exists()


def test_nsys_pointing_nowhere_fails_cleanly_in_a_subprocess(tmp_path):
    proc = cli(["--nsys", str(tmp_path / "no-nsys-here"), str(SLOW)], cwd=tmp_path)
    assert proc.returncode == NsysNotFoundError.exit_code
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---------------------------------------------------------------- planning (fast, real nsys --help only)


def test_our_options_stop_at_the_script_and_its_exit_code_passes_through(ready, monkeypatch, tmp_path):
    from nvtx_trace import cli as cli_mod

    seen = {}

    def fake_execute(plan, progress=None):  # the runner, not nsys: nsys is not run here
        seen["plan"] = plan
        return runner.RunResult(plan=plan, exit_code=7)

    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.chdir(tmp_path)
    code = cli_mod.main(["run", "--warmup-steps", "1", "--steps", "2", str(SLOW), "--steps", "100", "-m", "x"])
    plan = seen["plan"]
    assert code == 7
    assert plan.argv[-5:] == [str(SLOW), "--steps", "100", "-m", "x"]
    assert plan.argv[1:3] == ["-m", "nvtx_autotrace"] and plan.env[runner.CAPTURE_ENV].startswith("1:2:")


def test_plans_for_a_module_a_command_and_no_autotrace(ready, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # python -m finds pkg.train in the folder it runs from
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    mod = runner.plan_run(runner.RunOptions(target=["pkg.train", "--lr", "1"], module=True, out=tmp_path / "a"),
                          nsys=ready)
    assert mod.argv == [sys.executable, "-m", "nvtx_autotrace", "-m", "pkg.train", "--lr", "1"]
    assert mod.out_dir == (tmp_path / "a").resolve() and mod.mode == "module"
    cmd = runner.plan_run(runner.RunOptions(target=["torchrun", "--nproc_per_node=2", "t.py"],
                                            out_root=tmp_path), nsys=ready, now=0)
    assert cmd.mode == "command" and cmd.argv[0] == "torchrun"
    assert cmd.out_dir.name.startswith("torchrun-t-") and cmd.site_dir is not None
    assert cmd.env["PYTHONPATH"].split(os.pathsep)[0] == str(cmd.site_dir)
    plain = runner.plan_run(runner.RunOptions(target=[str(SLOW)], autotrace=False, out=tmp_path / "b",
                                              nsys_args=["--osrt-threshold=5000"]), nsys=ready)
    assert plain.argv == [sys.executable, str(SLOW)] and plain.extra[-1] == "--osrt-threshold=5000"
    # the package's own folder (nothing made in /tmp), shadowing no module but sitecustomize
    assert cmd.site_dir == INJECT_DIR and [p.name for p in INJECT_DIR.glob("*.py")] == ["sitecustomize.py"]


def test_auto_capture_mode_needs_a_cuda_build_of_torch_not_only_a_driver(ready, tmp_path, monkeypatch):
    monkeypatch.setattr(run_plan, "_has_cuda_device", lambda: True)  # a driver node, as on a GPU host
    opts = dict(target=[str(SLOW)], warmup_steps=1, steps=2, trace=["cuda", "nvtx"])
    facts = {"nvtx": "0.2.11", "autotrace": True}
    monkeypatch.setattr(run_plan.target_python, "probe", lambda _p, **_: {**facts, "torch_cuda": False})
    cpu = runner.plan_run(runner.RunOptions(out=tmp_path / "a", **opts), nsys=ready)
    assert cpu.env[runner.CAPTURE_ENV] == "1:2:nvtx:exit"  # (exit: stop the program after the window)
    monkeypatch.setattr(run_plan.target_python, "probe", lambda _p, **_: {**facts, "torch_cuda": True})
    gpu = runner.plan_run(runner.RunOptions(out=tmp_path / "b", **opts), nsys=ready)
    assert gpu.env[runner.CAPTURE_ENV] == "1:2:cuda:exit"
    assert torch_has_cuda(importlib.util.find_spec("torch")) is False  # this machine: the CPU wheel


def test_autotrace_depth_and_budget_reach_the_program_as_its_variables(ready, tmp_path):
    from nvtx_autotrace.options import Options

    plan = runner.plan_run(runner.RunOptions(target=[str(SLOW)], out=tmp_path / "a", autotrace_depth="2",
                                             autotrace_budget=0.5), nsys=ready)
    opts = Options.from_env(plan.env)
    assert (opts.module_depth, opts.budget_pct) == (2, 0.5)
    auto = runner.plan_run(runner.RunOptions(target=[str(SLOW)], out=tmp_path / "b"), nsys=ready)
    assert Options.from_env(auto.env).module_depth is None  # auto: chosen by the budget
    for bad in ({"autotrace_depth": "deep"}, {"autotrace_depth": "-2"}, {"autotrace_budget": 0.0},
                {"autotrace_budget": 101.0}, {"autotrace_depth": "1", "autotrace": False}):
        with pytest.raises(UsageError):
            runner.plan_run(runner.RunOptions(target=[str(SLOW)], out=tmp_path / "c", **bad), nsys=ready)


def test_shipped_sitecustomize_installs_autotrace_with_torch_and_chains_to_the_old_one(tmp_path):
    need("PyTorch", importlib.util.find_spec("torch") is not None)
    site, old = INJECT_DIR, tmp_path / "old"
    old.mkdir()
    (old / "sitecustomize.py").write_text("import os\nos.environ['OLD_SITECUSTOMIZE_RAN'] = '1'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(old)]), NVTX_AUTOTRACE="1")
    probe = ("import os, sys; a = 'nvtx_autotrace' in sys.modules; import torch; "
             "print(os.environ.get('OLD_SITECUSTOMIZE_RAN'), a, 'nvtx_autotrace' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False", "True"], out.stderr[-2000:]


def _fake_python(tmp_path: Path, nvtx: str | None) -> str:
    """An interpreter that answers run's probe as a Python without (or with this) nvtx would."""
    fake = tmp_path / f"python-nvtx-{nvtx}"
    fake.write_text("#!/bin/sh\necho '" + json.dumps({"nvtx": nvtx, "autotrace": True, "torch_cuda": False}) + "'\n")
    fake.chmod(0o755)
    return str(fake)


def test_run_refuses_before_starting_when_no_range_would_be_recorded(ready, tmp_path):
    opts = dict(target=[str(SLOW)], out=tmp_path / "o")
    with pytest.raises(UsageError) as err:
        runner.plan_run(runner.RunOptions(python=_fake_python(tmp_path, None), **opts), nsys=ready)
    assert "nvtx package is missing" in str(err.value) and "pip install 'nvtx==0.2.11'" in str(err.value)
    if locate.nvtx_problem("0.2.17", ready.version):  # e.g. Debian's 2022.4: 0.2.17 is not recorded
        with pytest.raises(UsageError, match="not recorded"):
            runner.plan_run(runner.RunOptions(python=_fake_python(tmp_path, "0.2.17"), **opts), nsys=ready)
    plan = runner.plan_run(runner.RunOptions(python=_fake_python(tmp_path, None), autotrace=False, **opts),
                           nsys=ready)  # without our ranges there is nothing to refuse
    assert not (tmp_path / "o").exists() and plan.argv[1:] == [str(SLOW)]


def _tmp_of(length: int) -> Path:
    """A fresh folder under /tmp whose path is ``length`` bytes long."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="s", dir="/tmp"))
    folder = base / ("d" * (length - len(str(base)) - 1))
    folder.mkdir()
    assert len(str(folder)) == length
    return folder


def test_a_tmpdir_too_deep_for_dataloader_sockets_is_said_before_run_try_and_tune(ready, tmp_path, monkeypatch,
                                                                                    capsys):
    """Stop 59's CI: a TMPDIR of 87 bytes made every DataLoader worker drop its batches ('AF_UNIX path too long'
    in its feeder thread) and the program wait for ever; under the tool it looked like a hung capture."""
    import shutil

    from nvtx_trace.cli.doctor import check_tmpdir
    from nvtx_trace.files import SOCKET_MAX, SOCKET_TAIL
    from nvtx_trace.runner.try_runs import TRY
    from nvtx_trace.runner.tune import TUNE

    monkeypatch.setattr(run_plan.target_python, "probe", lambda _p, **_: {"nvtx": "0.2.11", "autotrace": True})
    fits, deep = _tmp_of(SOCKET_MAX - SOCKET_TAIL), _tmp_of(SOCKET_MAX - SOCKET_TAIL + 1)
    try:
        for n, (folder, said) in enumerate([(fits, False), (deep, True)]):
            plan = runner.plan_run(runner.RunOptions(target=[str(SLOW)], out=tmp_path / str(n)), nsys=ready,
                                   environ={**os.environ, "TMPDIR": str(folder)})
            notes = [note for note in plan.notes if "AF_UNIX" in note]
            assert bool(notes) == said, plan.notes
            monkeypatch.setenv("TMPDIR", str(folder))
            TRY.say_tmp_warning()
            TUNE.say_tmp_warning()
            err = capsys.readouterr().err
            assert (err.count("AF_UNIX") == 2) == said, err
            assert (check_tmpdir().status == "warn") == said  # doctor says it too
        assert notes[0].startswith(f"TMPDIR is 76 bytes long ({deep})") and "at most 75 bytes" in notes[0]
        assert err.startswith("nvtx-trace try: warning: TMPDIR is 76 bytes long")
    finally:
        shutil.rmtree(fits.parent), shutil.rmtree(deep.parent)


@pytest.mark.torch
@pytest.mark.slow
def test_the_deepest_tmpdir_said_to_fit_fits_and_one_byte_more_does_not(tmp_path):
    """The warning's limit is the real one, not a guess: the same DataLoader program, plain, steps at 75 bytes
    and drops its first batch at 76 (its workers' feeder threads say why; it then waits for ever)."""
    import shutil

    from nvtx_trace.files import SOCKET_MAX, SOCKET_TAIL

    for extra, steps in [(0, True), (1, False)]:
        folder = _tmp_of(SOCKET_MAX - SOCKET_TAIL + extra)
        try:
            proc = subprocess.Popen([sys.executable, str(SLOW), "--workers", "2", "--steps", "3"], text=True,
                                    env={**os.environ, "TMPDIR": str(folder)}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)
            try:
                _, err = proc.communicate(timeout=60 if steps else 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            assert ("step 2 loss" in err) == steps and ("AF_UNIX path too long" in err) != steps, err[-1500:]
        finally:
            shutil.rmtree(folder.parent, ignore_errors=True)
