"""Bad input: one clear line on stderr, a non-zero exit, no traceback, and the input left untouched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import again_after_nsys_fault

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_reports" / "resnet_flawed_user.sqlite"


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def run_cli_here(*args):
    """``run_cli`` in this process: the same exit code and output, without a second of interpreter start-up each
    (the unit loop, issue 54); for commands that start no process of their own."""
    import contextlib
    import io

    from nvtx_trace.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"


def assert_one_clear_line(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("nvtx-trace: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def make_empty(tmp):
    p = tmp / "empty.sqlite"
    p.write_bytes(b"")
    return p


def make_random(tmp):
    p = tmp / "random.sqlite"
    p.write_bytes(os.urandom(4096))
    return p


def make_truncated(tmp):
    p = tmp / "truncated.sqlite"
    data = SAMPLE.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    return p


def make_not_nsys(tmp):
    p = tmp / "other.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE people(name TEXT)")
    conn.execute("INSERT INTO people VALUES ('ada')")
    conn.commit()
    conn.close()
    return p


def make_dir(tmp):
    p = tmp / "a_directory.sqlite"
    p.mkdir()
    return p


def make_missing(tmp):
    return tmp / "does_not_exist.sqlite"


@pytest.mark.parametrize("maker, needle", [
    (make_empty, "is empty"),
    (make_random, "not a SQLite file"),
    (make_truncated, "export it again"),
    (make_not_nsys, "not an Nsight Systems export"),
    (make_dir, "is a directory"),
    (make_missing, "no such file"),
])
def test_bad_report_gets_one_line_and_nonzero_exit(tmp_path, maker, needle):
    path = maker(tmp_path)
    before = digest(path) if path.exists() else None
    proc = run_cli("analyze", path)
    assert_one_clear_line(proc, needle, str(path))
    assert (digest(path) if path.exists() else None) == before


@pytest.mark.parametrize("words, needles", [
    (["analyze", SAMPLE, "--no-such-option"], ["No such option: --no-such-option", "nvtx-trace analyze --help"]),
    (["analyze", "--min-gap-ms", "abc", SAMPLE], ["'--min-gap-ms'", "nvtx-trace analyze --help"]),
    (["analyze"], ["Missing argument 'REPORT'"]),
    (["analyze", SAMPLE, "--min-gap-ms"], ["'--min-gap-ms' requires an argument", "nvtx-trace analyze --help"]),
    (["diff", SAMPLE], ["Missing argument 'AFTER'", "nvtx-trace diff --help"]),
    (["analyse", SAMPLE], ["No such command 'analyse'", "analyze", "nvtx-trace --help"]),
])
def test_a_usage_error_is_one_line_saying_where_help_is(words, needles):
    """click prints four lines (usage, a hint, a blank line, the error); ours is one, exit 2."""
    proc = run_cli(*words)
    assert proc.returncode == 2
    assert_one_clear_line(proc, *needles)


def test_no_verb_prints_the_help_and_no_empty_error():
    proc = run_cli()
    assert "Usage: nvtx-trace" in proc.stdout and "run" in proc.stdout
    assert proc.stderr.strip() == "", proc.stderr


@pytest.mark.parametrize("option, needle", [
    (["--min-gap-ms", "nan"], "--min-gap-ms must be a number from 0"),
    (["--min-gap-ms", "inf"], "--min-gap-ms must be a number from 0"),
    (["--min-gap-ms", "-1"], "--min-gap-ms must be a number from 0"),
    (["--loader-pattern", "("], "not a valid regular expression"),
    (["--warmup-steps", "-2"], "--warmup-steps must be >= 0"),
])
def test_impossible_option_values_are_usage_errors(option, needle):
    proc = run_cli("analyze", SAMPLE, *option)
    assert_one_clear_line(proc, needle)
    assert proc.returncode == 2


def test_run_checks_the_analysis_options_before_profiling(tmp_path):
    proc = run_cli("run", "--out", tmp_path / "out", "--min-gap-ms", "-0.5", ROOT / "programs" / "cpu_train.py")
    assert_one_clear_line(proc, "--min-gap-ms must be a number from 0")
    assert not (tmp_path / "out").exists()


def test_json_and_html_cannot_share_a_path_or_replace_the_input(tmp_path):
    out = tmp_path / "both"
    assert_one_clear_line(run_cli("analyze", SAMPLE, "--json", out, "--html", out), "are the same file")
    copy = tmp_path / "report.sqlite"
    shutil.copyfile(SAMPLE, copy)
    before = digest(copy)
    assert_one_clear_line(run_cli("analyze", copy, "--json", copy, "--force"), "is the input report")
    assert_one_clear_line(run_cli("analyze", copy, "--json", copy), "is the input report")
    assert digest(copy) == before and not out.exists()


def test_refuses_to_overwrite_an_output_without_force(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("keep me")
    proc = run_cli("analyze", SAMPLE, "--json", out)
    assert_one_clear_line(proc, "already exists", "--force")
    assert out.read_text() == "keep me"
    assert run_cli("analyze", SAMPLE, "--json", out, "--force").returncode == 0
    assert out.read_text().startswith("{")


def test_analysis_leaves_the_report_byte_identical(tmp_path):
    copy = tmp_path / "r.sqlite"
    shutil.copy(SAMPLE, copy)
    before = digest(copy)
    assert run_cli("analyze", copy, "--json", tmp_path / "o.json").returncode == 0
    assert digest(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json", "r.sqlite"]  # no -journal/-wal left behind


def capture_cpu(nsys: str, tmp: Path, code: str, trace: str = "nvtx,osrt") -> Path:
    """A real Debian-nsys capture of a tiny Python program, exported to SQLite."""
    script = tmp / "prog.py"
    script.write_text(textwrap.dedent(code))
    from nvtx_trace.capture import export, locate
    from nvtx_trace.capture import profile as profiling

    tool = locate.find_nsys(nsys)
    result = again_after_nsys_fault(lambda: profiling.profile(tool, [sys.executable, str(script)], tmp / "cap",
                                                      trace=trace.split(","), extra=["--sample=none", "--cpuctxsw=none"]))
    assert result.rep is not None, result
    return export.export_sqlite(tool, result.rep)


def test_export_with_no_gpu_activity_and_no_ranges_is_refused(nsys_path, tmp_path):
    report = capture_cpu(nsys_path, tmp_path, "import time; time.sleep(0.2)\n", trace="osrt")
    before = digest(report)
    proc = run_cli("analyze", report)
    assert_one_clear_line(proc, "no GPU activity and no NVTX ranges")
    assert digest(report) == before


def test_ranges_that_never_close_are_closed_at_trace_end_with_a_warning(nsys_path, tmp_path):
    report = capture_cpu(nsys_path, tmp_path, """
        import time, nvtx
        for i in range(3):
            nvtx.push_range(f"step {i}"); nvtx.push_range("data"); time.sleep(0.03); nvtx.pop_range()
            time.sleep(0.01); nvtx.pop_range()
        nvtx.start_range("prefetch")                  # a start/end range that is never ended
        nvtx.push_range("step 3"); time.sleep(0.05)   # the process exits inside this range
    """)
    proc = run_cli("analyze", report, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # nsys itself ends still-open ranges when the process exits, so the export has no open row ...
    assert out["steps"]["summary"]["steps"] == 4
    assert "gpu_idle" in out["skipped"] and "CUDA" in out["skipped"]["gpu_idle"]
    # ... but exports cut short (or written by other versions) have rows with end NULL: make one.
    edited = tmp_path / "open.sqlite"
    shutil.copy(report, edited)
    conn = sqlite3.connect(edited)
    conn.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE textId = (SELECT id FROM StringIds WHERE value = 'step 3')")
    conn.commit()
    conn.close()
    proc = run_cli("analyze", edited, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert any("1 NVTX range(s) never closed" in w for w in out["warnings"])
    steps = out["steps"]["table"]
    assert len(steps) == 4 and steps[-1]["end_ns"] == out["trace"]["end_ns"]


def copy_of_sample(tmp_path) -> Path:
    report = tmp_path / "report.sqlite"
    shutil.copyfile(SAMPLE, report)
    return report


@pytest.mark.parametrize("case", ["symlink_loop", "dangling_symlink"])
def test_a_report_path_that_leads_nowhere(tmp_path, case):
    path = tmp_path / "loop.sqlite"
    if case == "symlink_loop":
        os.symlink(tmp_path / "other.sqlite", path)
        os.symlink(path, tmp_path / "other.sqlite")
        assert_one_clear_line(run_cli("analyze", path), "symbolic link loop")
    else:
        os.symlink(tmp_path / "gone.sqlite", path)
        assert_one_clear_line(run_cli("analyze", path), "does not exist")


@pytest.mark.parametrize("value", ["1e308", "86400001", "inf", "-0.5"])
def test_min_gap_out_of_range(value):
    assert_one_clear_line(run_cli("analyze", SAMPLE, "--min-gap-ms", value), "--min-gap-ms")


@pytest.mark.parametrize("case", ["parent_is_a_file", "existing_dir_with_force", "hard_link_to_input_with_force",
                                  "symlink_to_input_with_force", "json_and_html_same_file"])
def test_output_paths_checked_before_any_work_and_the_input_never_written(tmp_path, case):
    report = copy_of_sample(tmp_path)
    before = digest(report)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    args = {
        "parent_is_a_file": ["--json", blocker / "out.json"],
        "existing_dir_with_force": ["--json", tmp_path, "--force"],
        "hard_link_to_input_with_force": ["--json", tmp_path / "hard.json", "--force"],
        "symlink_to_input_with_force": ["--html", tmp_path / "soft.html", "--force"],
        "json_and_html_same_file": ["--json", tmp_path / "o", "--html", tmp_path / "." / "o"],
    }[case]
    if case == "hard_link_to_input_with_force":
        os.link(report, tmp_path / "hard.json")
    if case == "symlink_to_input_with_force":
        os.symlink(report, tmp_path / "soft.html")
    proc = run_cli("analyze", report, *args)
    assert_one_clear_line(proc)
    assert "Analyzing" not in proc.stderr  # refused before the analysis started
    assert digest(report) == before and blocker.read_text() == "x"


def test_json_file_is_written_even_when_stdout_closes_early(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run(f"{sys.executable} -m nvtx_trace.cli analyze {SAMPLE} --json - --html {tmp_path / 'r.html'}"
                          f" | head -c 10; test -s {tmp_path / 'r.html'}", shell=True, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    proc = subprocess.run(f"{sys.executable} -m nvtx_trace.cli analyze {SAMPLE} --json {out} | head -n 1",
                          shell=True, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(out.read_text())["schema_version"] == 1


def test_a_wal_mode_export_is_read_whole_and_nothing_is_written_beside_it(tmp_path):
    """Every page of this export is still in its -wal file: an immutable open would see an empty database."""
    work = tmp_path / "work.sqlite"
    conn = sqlite3.connect(work)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(f"ATTACH DATABASE '{SAMPLE}' AS s")
    for (table,) in conn.execute("SELECT name FROM s.sqlite_master WHERE type='table'").fetchall():
        conn.execute(f'CREATE TABLE main."{table}" AS SELECT * FROM s."{table}"')
    conn.commit()
    folder = tmp_path / "report"
    folder.mkdir()
    shutil.copyfile(work, folder / "wal.sqlite")  # copied while open: the pages are only in the -wal
    shutil.copyfile(str(work) + "-wal", folder / "wal.sqlite-wal")
    conn.close()
    before = {p.name: digest(p) for p in folder.iterdir()}
    got = run_cli("analyze", folder / "wal.sqlite", "--json", "-")
    assert got.returncode == 0, got.stderr
    want = run_cli("analyze", SAMPLE, "--json", "-")
    strip = lambda d: {k: v for k, v in json.loads(d).items() if k != "report"}  # noqa: E731
    assert strip(got.stdout) == strip(want.stdout)
    assert {p.name: digest(p) for p in folder.iterdir()} == before  # no -shm, nothing changed


@pytest.mark.parametrize("case", ["hard_link", "symlink_loop_report"])
def test_redact_never_writes_over_its_input(tmp_path, case):
    report = copy_of_sample(tmp_path)
    before = digest(report)
    if case == "hard_link":
        os.link(report, tmp_path / "copy.sqlite")
        proc = run_cli("redact", report, "-o", tmp_path / "copy.sqlite", "--force")
        assert_one_clear_line(proc, "the same file")
    else:
        os.symlink(tmp_path / "b.sqlite", tmp_path / "a.sqlite")
        os.symlink(tmp_path / "a.sqlite", tmp_path / "b.sqlite")
        assert_one_clear_line(run_cli("redact", tmp_path / "a.sqlite", "-o", tmp_path / "out.sqlite"), "loop")
    assert digest(report) == before


@pytest.mark.parametrize("case", ["under_a_file", "unwritable"])
def test_run_refuses_an_output_folder_it_cannot_write_before_running_anything(tmp_path, case):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    if case == "under_a_file":
        out = blocker / "out"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write anywhere: a read-only folder cannot be made here")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        out = ro / "out"
    marker = tmp_path / "ran"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    proc = run_cli("run", "--out", out, "--no-autotrace", script)
    assert_one_clear_line(proc, "--out")
    assert not marker.exists()


def test_two_analyses_writing_one_file_leave_one_whole_file(tmp_path):
    """Concurrent writers of one --json path: writes go through a temporary file and a rename, so the file
    is always one whole summary, never two interleaved, and no temporary file is left behind."""
    out = tmp_path / "summary.json"
    procs = [subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(SAMPLE), "--json", str(out),
                               "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert all("Traceback" not in e for e in errs), errs
    assert json.loads(out.read_text())["schema_version"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def _fifo(tmp):
    p = tmp / "pipe.sqlite"
    os.mkfifo(p)
    return p


HOSTILE = {  # name: (argv with {tmp}/{sample}/{report} placeholders, or a maker, words the one line must hold)
    "report_is_a_fifo": (lambda t: ["analyze", _fifo(t)], "not a regular file"),
    "report_is_a_char_device": (lambda t: ["analyze", "/dev/null"], "not a regular file"),
    "nsys_rep_without_a_usable_nsys": (lambda t: ["analyze", _garbage(t, "r.nsys-rep"), "--nsys", t / "no-nsys"], ""),
    "html_max_points_too_small": (lambda t: ["analyze", SAMPLE, "--html-max-points", "5"], "--html-max-points"),
    "json_parent_missing": (lambda t: ["analyze", SAMPLE, "--json", t / "no" / "x.json"], "does not exist"),
    "json_empty_path": (lambda t: ["analyze", SAMPLE, "--json", ""], "empty path"),
    "step_range_bad_regex": (lambda t: ["analyze", SAMPLE, "--step-range", "(unclosed"], "--step-range"),
    "warmup_steps_negative": (lambda t: ["analyze", SAMPLE, "--warmup-steps", "-3"], "--warmup-steps"),
    "run_missing_script": (lambda t: ["run", t / "nope.py"], "no such script"),
    "run_missing_python": (lambda t: ["run", "--python", t / "no-python", _script(t)], "not found"),
    "run_missing_nsys": (lambda t: ["run", "--nsys", t / "no-nsys", _script(t)], "nsys"),
    "run_window_half_given": (lambda t: ["run", "--warmup-steps", "1", _script(t)], "--warmup-steps N and --steps M"),
    "run_window_zero_steps": (lambda t: ["run", "--warmup-steps", "0", "--steps", "0", _script(t)], "--steps"),
    "run_bad_capture_mode": (lambda t: ["run", "--warmup-steps", "1", "--steps", "1", "--capture-mode", "x",
                                        _script(t)], "--capture-mode"),
    "run_bad_autotrace_depth": (lambda t: ["run", "--autotrace-depth", "deep", _script(t)], "--autotrace-depth"),
    "run_zero_autotrace_budget": (lambda t: ["run", "--autotrace-budget", "0", _script(t)], "--autotrace-budget"),
    "run_depth_without_autotrace": (lambda t: ["run", "--no-autotrace", "--autotrace-depth", "1", _script(t)],
                                    "--no-autotrace"),
    "run_full_with_a_window": (lambda t: ["run", "--full", "--warmup-steps", "1", "--steps", "2", _script(t)],
                               "--full profiles everything"),
    "history_negative_last": (lambda t: ["history", "--last", "-1"], "--last"),
    "redact_missing_report": (lambda t: ["redact", t / "none.sqlite", "-o", t / "o.sqlite"], "no such file"),
    "redact_output_exists": (lambda t: ["redact", SAMPLE, "-o", _garbage(t, "exists.sqlite")], "already exists"),
    "redact_output_is_a_directory": (lambda t: ["redact", SAMPLE, "-o", t, "--force"], "directory"),
}


def _garbage(tmp, name):
    p = tmp / name
    p.write_bytes(b"not a report")
    return p


def _script(tmp):
    p = tmp / "train.py"
    p.write_text("print('ran')\n")
    return p


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_invocations_get_one_clear_line(tmp_path, case):
    make, words = HOSTILE[case]
    before = digest(SAMPLE)
    proc = run_cli(*make(tmp_path))
    assert_one_clear_line(proc, *([words] if words else []))
    assert "ran" not in proc.stdout  # nothing was run
    assert digest(SAMPLE) == before


def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_completes(tmp_path):
    """Two `run`s into one --out: the second is one clear line (even with --force), the first is untouched."""
    from conftest import installed_nsys

    installed_nsys()
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(6)\nprint('first done')\n")
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "run", "--no-autotrace", "--trace", "osrt",
                              "--out", str(out), str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    lock = out / ".nvtx-trace-run.lock"
    deadline = time.monotonic() + 60  # the CLI's start-up and nsys's probes first, slow on a loaded machine
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.exists(), first.communicate()[1][-2000:]
    second = run_cli("run", "--no-autotrace", "--trace", "osrt", "--out", out, "--force", _script(tmp_path))
    assert_one_clear_line(second, "being written by another nvtx-trace run")
    stdout, stderr = first.communicate(timeout=300)
    assert "first done" in stdout and "Traceback" not in stderr
    assert (out / "report.nsys-rep").exists() and not lock.exists()


def test_a_module_python_would_not_find_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """`-m` with a module that does not exist was profiled and "analyzed" (issue 52, item 10): now one line before
    nsys starts, for run and tune, and nothing is left behind. The lookup imports nothing (not even the package
    of a dotted name) and looks in the current folder first, as `python -m` does."""
    from conftest import installed_nsys

    from nvtx_trace.capture.python_facts import module_found

    installed_nsys()
    monkeypatch.chdir(tmp_path)
    for command in (["run", "--out", tmp_path / "run", "-m", "no_such_module_zz"],
                    ["tune", "--out", tmp_path / "tune", "-m", "pkg.no_such_module"]):
        assert_one_clear_line(run_cli_here(*command), "finds no module of that name")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "pkg" / "train.py").write_text("")
    assert module_found("pkg.train") and not module_found("pkg.nope") and not module_found("pkg-x")
    assert module_found("json.tool") and not module_found("json.no_such")
