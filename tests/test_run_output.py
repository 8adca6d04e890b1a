"""What `nvtx-trace run` prints, with the real nsys: the program's own output unchanged, our short progress
lines, and none of nsys's chatter ("Generated: ...qdstrm", "Importer error status", progress bars), which
goes to nsys.log in the run's folder and is shown (its tail) only when a step fails. And no temporary
folder of ours is left behind, whether the run is refused, fails or succeeds."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, again_after_nsys_fault, installed_nsys, need

from nvtx_trace.capture import own_output
from nvtx_trace.capture.nsys_log import LOG_NAME

PROGRAM = """
import sys
print("program line 1 to stdout")
print("program line 1 to stderr", file=sys.stderr)
print("partial to stdout, no newline", end="")
sys.stdout.flush()
print()
print("program line 2 to stdout")
print("program line 2 to stderr", file=sys.stderr)
"""
# nsys 2022.4's own lines on a run (seen on this machine without the separation): none may reach the user
CHATTER = re.compile(r"Generat(ing|ed)|Importer error status|Unable to retrieve the importer|Processing \[|"
                     r"Exporting \d+ events|\.qdstrm|Saved report file|Collecting data")


@pytest.fixture(scope="module")
def ready():
    found = installed_nsys()
    need("nvtx Python package", __import__("importlib.util").util.find_spec("nvtx") is not None)
    return found


def cli(args, cwd: Path, env=None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", *map(str, args)], cwd=cwd, env=env,
                          text=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=300, **kw)


@pytest.fixture(scope="module")
def quiet_run(ready, tmp_path_factory):
    work = tmp_path_factory.mktemp("quiet")
    (work / "prog.py").write_text(PROGRAM)
    started = time.monotonic()
    # --full: the whole run (the default window would run this step-less script a second time, in full;
    # test_default_window.py covers that)
    proc = again_after_nsys_fault(lambda: cli(["--out", "out", "--trace", "nvtx", "--full", "prog.py"], cwd=work),
                          clear=work / "out")
    proc.wall_s = time.monotonic() - started
    return proc, work / "out"


def test_the_program_output_reaches_us_unchanged_and_in_order(quiet_run):
    proc, _ = quiet_run
    assert proc.returncode == 3, proc.stderr[-3000:]  # the program succeeded; its report holds nothing to analyze
    assert proc.stdout.startswith("program line 1 to stdout\npartial to stdout, no newline\nprogram line 2 to stdout\n")
    program_err = [ln for ln in proc.stderr.splitlines() if ln.startswith("program ")]
    assert program_err == ["program line 1 to stderr", "program line 2 to stderr"]


def test_our_progress_lines_are_shown_and_nsys_chatter_is_not(quiet_run):
    proc, _ = quiet_run
    assert not CHATTER.search(proc.stdout + proc.stderr), proc.stdout + proc.stderr
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("nvtx-trace: ")]
    assert ours[0].startswith("nvtx-trace: profiling the whole run with nsys")
    ended = re.match(r"nvtx-trace: capture ended after (\d+\.\d) s$", ours[1])
    # nsys alone takes over a second to start and write; the whole command, timed here, took longer still
    assert ended and 0.5 < float(ended[1]) < proc.wall_s, (ours, proc.wall_s)
    assert "nvtx-trace: exporting to SQLite…" in ours and "nvtx-trace: analyzing…" in ours


def test_the_log_in_the_run_folder_holds_nsys_lines_and_not_the_program(quiet_run, ready):
    proc, out = quiet_run
    log = (out / LOG_NAME).read_text()
    assert log.startswith(f"== nsys profile == {ready.path} profile -o {out.resolve() / 'report'} ")
    printed = next(ln for ln in proc.stderr.splitlines() if ln.startswith("$ "))
    ran = log.splitlines()[0][len("== nsys profile == "):]
    assert shlex.split(printed[2:]) == ran.split()  # the command line printed is the one that ran
    assert "== nsys export ==" in log and "Generated:" in log  # nsys names the capture it wrote
    if ready.imports_itself is False:  # Debian's split layout: nsys cannot import, we do
        assert "Importer error status" in log and "== nsys import ==" in log
    assert "program line" not in log
    bars = [ln for ln in log.splitlines() if re.search(r"\[[= ]*\d+%[= ]*\]", ln)]
    assert all("100%" in ln for ln in bars), bars  # each progress bar kept at its last state only


def test_a_failing_export_shows_the_tail_of_nsys_log(ready, tmp_path):
    """The real nsys profiles; its export is made to fail by a wrapper, as a broken install would."""
    wrapper = tmp_path / "nsys"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$1\" = export ]; then\n  echo 'Exporting: preparing'\n"
                       f"  echo 'fatal: the export broke (test)' >&2\n  exit 7\nfi\nexec {ready.path} \"$@\"\n")
    wrapper.chmod(0o755)
    (tmp_path / "prog.py").write_text(PROGRAM)
    proc = cli(["--nsys", wrapper, "--out", "out", "--trace", "nvtx", "--full", "prog.py"], cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr[-3000:]
    flat = " ".join(proc.stderr.split())
    log = tmp_path / "out" / LOG_NAME
    assert "gave no valid SQLite file (status 7): Exporting: preparing / fatal: the export broke (test)" in flat
    assert f"nsys's output is in {log.resolve()}" in flat and "Traceback" not in proc.stderr
    assert "fatal: the export broke (test)" in log.read_text()
    assert not CHATTER.search(proc.stdout + proc.stderr.replace(str(log.resolve()), ""))


def test_output_through_nsys_is_sorted_when_our_descriptors_do_not_reach_the_program(ready, tmp_path, capfd,
                                                                                      monkeypatch):
    """Should the handover fail (the wrapper gets no descriptors), the wrapper says so and the mixed stream is
    sorted line by line: the program's lines still reach us and nsys's known lines still do not."""
    from nvtx_trace import runner

    monkeypatch.setattr(own_output.Handover, "_send", lambda self, conn: None)  # hands nothing over
    (tmp_path / "prog.py").write_text(PROGRAM)
    plan = runner.plan_run(runner.RunOptions(target=[str(tmp_path / "prog.py")], autotrace=False,
                                             out=tmp_path / "out", trace=["nvtx"], html=False), nsys=ready)
    result = runner.execute(plan)
    assert result.profile.rep is not None, result.problems
    out, err = capfd.readouterr()
    assert "program line 1 to stdout" in out and "program line 2 to stdout" in out
    assert "program line 1 to stderr" in err and "program line 2 to stderr" in err
    assert not CHATTER.search(out + err), out + err
    log = (tmp_path / "out" / LOG_NAME).read_text()
    assert own_output.FALLBACK_MARKER in log and "Generated:" in log


# ---------------------------------------------------------------- no temporary folders left behind


def test_no_temporary_folder_is_left_when_a_run_is_refused_fails_or_succeeds(ready, tmp_path):
    """Each run gets its own TMPDIR (where the sitecustomize of `run -- COMMAND` used to be generated)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    (tmp_path / "prog.py").write_text(PROGRAM)
    held = tmp_path / "held"
    held.mkdir()
    (held / "summary.json").write_text("{}")
    runs = {  # name: (arguments, exit code, a line the program prints)
        "--out holds outputs": (["--out", held, "--", "sh", "-c", "exit 0"], 2, None),
        "command not found": (["--out", "o1", "--", "no-such-command-here"], 2, None),
        "command that fails": (["--out", "o2", "--trace", "nvtx", "--", "sh", "-c", "echo failing; exit 4"], 4,
                               "failing"),
        "script run": (["--out", "o3", "--trace", "nvtx", "prog.py"], 3, "program line 2 to stdout"),
    }
    for name, (args, code, printed) in runs.items():
        proc = cli(args, cwd=tmp_path, env=env)
        assert proc.returncode == code and "Traceback" not in proc.stderr, (name, proc.stderr[-2000:])
        assert printed is None or printed in proc.stdout.splitlines(), (name, proc.stdout)
        assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("nvtx-trace")) == [], name
