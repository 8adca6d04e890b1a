"""An output is never an input, and every write fails cleanly: real commands (`python -m nvtx_trace.cli`) on
real sample reports and run folders, each refused or failed case one line on stderr, a non-zero exit, no
traceback, every input byte-identical (SHA-256), and no partial or temporary file left.

Full disks and read-only folders are real: a small tmpfs mounted for the test (root; skipped elsewhere, the
file-size-limit cases need no root), /proc, /dev/full, a closed stdout and a pipe whose reader left."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, again_after_nsys_fault, fill, installed_nsys

SAMPLES = ROOT / "sample_reports"
SMALL = SAMPLES / "cpu_slow_loader.sqlite"
OTHER = SAMPLES / "resnet_flawed_user.sqlite"


def run_cli(*args, cwd=None, **kw):
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300, **kw)


def digests(*paths) -> dict:
    """SHA-256 of every file under the paths (a folder: each file in it)."""
    found = {}
    for path in map(Path, paths):
        for f in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            found[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return found


def one_line(proc, *needles, code=None) -> str:
    """The failed command said exactly one line, `nvtx-trace: error: ...`, holding ``needles``."""
    assert proc.returncode != 0 if code is None else proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nvtx-trace: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Hidden temporary files (ours: .NAME.xxx.tmp, .NAME.PID.redact-tmp, probes, -journal) left in a folder."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith("-journal"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two run folders as `nvtx-trace run` leaves them (report.sqlite, summary.json, summary.html), made by
    analyze from two shipped samples; every test checks they are unchanged."""
    base = tmp_path_factory.mktemp("runs")
    for name, sample in (("before", OTHER), ("after", SMALL)):
        folder = base / name
        folder.mkdir()
        shutil.copyfile(sample, folder / "report.sqlite")
        made = run_cli("analyze", folder / "report.sqlite", "--json", folder / "summary.json",
                       "--html", folder / "summary.html")
        assert made.returncode == 0, made.stderr
    return base / "before", base / "after"


def file_size_limit(limit: int):
    """preexec_fn: RLIMIT_FSIZE (no root needed); Python ignores SIGXFSZ, so a write past it fails with EFBIG."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


# ================================================================ outputs vs inputs


def test_diff_refuses_to_write_into_its_input_run_folder_and_diff_still_works_after(runs):
    """The issue's data loss: `diff BEFORE AFTER --json BEFORE/summary.json --force` replaced the run's summary."""
    before, after = runs
    kept = digests(before, after)
    one_line(run_cli("diff", before, after, "--json", before / "summary.json", "--force"), "inside", str(before))
    assert digests(before, after) == kept
    again = run_cli("diff", before, after, "--json", "-")
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert {f["status"] for f in json.loads(again.stdout)["findings"]} >= {"resolved"}


@pytest.mark.parametrize("side, option, name", [
    ("after", "--html", "summary.html"),  # replaced a 4.9 MB run page with a diff page
    ("before", "--json", "report.sqlite"),
    ("after", "--json", "report.nsys-rep"),  # not there yet: still the run's name
    ("before", "--html", "diff.html"),  # a new file in the folder: the folder is an input as a whole
    ("after", "--json", "sub/x.json"),  # deeper, in a folder that does not exist
])
def test_no_output_of_diff_goes_into_a_folder_given_as_input(runs, side, option, name):
    before, after = runs
    folder = before if side == "before" else after
    existed = (folder / name).exists()
    kept = digests(before, after)
    one_line(run_cli("diff", before, after, option, folder / name, "--force"), "inside")
    assert digests(before, after) == kept and (folder / name).exists() == existed


@pytest.mark.parametrize("spelling", ["symlink_to_folder", "dot_dot", "symlink_to_a_file_in_it"])
def test_an_input_folder_is_recognised_by_any_spelling(runs, tmp_path, spelling):
    before, after = runs
    kept = digests(before, after)
    if spelling == "symlink_to_folder":
        (tmp_path / "link").symlink_to(before)
        out = tmp_path / "link" / "summary.json"
    elif spelling == "dot_dot":
        out = before / ".." / before.name / "summary.json"
    else:
        out = tmp_path / "soft.json"
        out.symlink_to(before / "summary.json")
    one_line(run_cli("diff", before, after, "--json", out, "--force"), "inside", code=2)
    assert digests(before, after) == kept


def test_a_hard_link_to_a_run_file_is_replaced_never_written_through(runs, tmp_path):
    """A hard link outside the folder shares the run's inode: the output replaces the link (a rename), and the
    run's own summary keeps its bytes."""
    before, after = runs
    kept = digests(before, after)
    out = tmp_path / "hard.json"
    os.link(before / "summary.json", out)
    proc = run_cli("diff", before, after, "--json", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert digests(before, after) == kept and "step_statistic" in json.loads(out.read_text())


def test_analyze_of_a_folder_of_rank_reports_writes_nothing_into_it(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in (0, 1):
        shutil.copyfile(SAMPLES / f"ddp_straggler_rank{r}_h200x2.sqlite", ranks / f"rank{r}.sqlite")
    kept = digests(ranks)
    # a new rank2.sqlite there would be read as a third rank by the next analysis of the folder
    one_line(run_cli("analyze", ranks, "--json", ranks / "rank2.sqlite"), "inside")
    one_line(run_cli("analyze", ranks / "rank0.sqlite", ranks / "rank1.sqlite", "--html", ranks / "rank1.sqlite",
                     "--force"), "the same file")
    assert digests(ranks) == kept and sorted(p.name for p in ranks.iterdir()) == ["rank0.sqlite", "rank1.sqlite"]


def test_an_output_that_names_a_report_some_other_way_is_refused_before_the_analysis(tmp_path):
    """The output check comes before any reading: with a report that cannot be analyzed, the line is about the
    output (/proc), so nothing was analyzed first."""
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a report at all" * 50)
    for out in ("/proc/summary.html", "/proc/self/summary.html"):
        line = one_line(run_cli("analyze", broken, "--html", out), code=2)
        assert "/proc" in line and "broken.sqlite" not in line


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """A real raw capture (.qdstrm) of a tiny NVTX program, as an interrupted run or Debian's nsys leaves it."""
    nsys = installed_nsys()
    if nsys.importer is None:
        pytest.skip(f"no QdstrmImporter: {nsys.importer_problem}")
    work = tmp_path_factory.mktemp("capture")
    (work / "prog.py").write_text("import time, nvtx\nfor i in range(3):\n    with nvtx.annotate(f'step {i}'):\n"
                                  "        time.sleep(0.02)\n")
    from nvtx_trace.capture.profile import profile

    # through the tool's own capture: a hung nsys is ended (and its agent) instead of spinning for the suite
    result = again_after_nsys_fault(lambda: profile(nsys, [sys.executable, "prog.py"], work / "cap", trace=["nvtx"],
                                            extra=["--sample=none", "--cpuctxsw=none"], cwd=work,
                                            capture_output=True))
    if result.qdstrm is None or not result.qdstrm.is_file():
        pytest.skip(f"this nsys imported the capture itself and left no .qdstrm ({result.log[-300:]})")
    return result.qdstrm


@pytest.mark.nsys
def test_analyze_of_a_raw_capture_leaves_it_byte_identical(capture, tmp_path):
    """QdstrmImporter appends to the file it imports: the user's .qdstrm is imported from a private copy."""
    raw = tmp_path / "run.qdstrm"
    shutil.copyfile(capture, raw)
    kept = digests(raw)
    proc = run_cli("analyze", raw, "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert digests(raw) == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.nsys-rep", "run.qdstrm", "run.sqlite", "s.json"]
    assert json.loads((tmp_path / "s.json").read_text())["schema_version"] == 1


@pytest.mark.nsys
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_analyze_imports_ends_its_helper_and_leaves_nothing(capture, tmp_path, signum):
    """A scheduler's SIGTERM or a closed ssh's SIGHUP while `analyze` runs nsys's importer or exporter: before,
    nvtx-trace died at once (default action) and its helper ran on, writing beside the input. Now: one line,
    128 + the signal, the helper ended, no partial file, the input unchanged."""
    from nvtx_trace.capture import processes

    raw = tmp_path / "run.qdstrm"
    shutil.copyfile(capture, raw)
    kept = digests(raw)
    proc = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(raw)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    helpers: list[int] = []
    deadline = time.monotonic() + 120
    while not helpers and proc.poll() is None and time.monotonic() < deadline:
        helpers = [p for p in processes.descendants(proc.pid) if processes.of_nsys(processes.name_of(p))]
        time.sleep(0.01)
    try:
        assert helpers, "analyze ended before its helper was seen"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum and "Traceback" not in err, err[-2000:]
    assert err.strip().splitlines()[-1] == f"nvtx-trace: interrupted ({signal.Signals(signum).name})", err
    time.sleep(0.5)
    assert not [p for p in helpers if processes.alive(p)]
    # stopped while importing: nothing beside the input; while exporting (the import, 0.1 s here, was missed):
    # the complete import stays, as it is meant to; never a partial file
    left = sorted(p.name for p in tmp_path.iterdir())
    assert digests(raw) == kept and left in (["run.qdstrm"], ["run.nsys-rep", "run.qdstrm"]), left


@pytest.mark.nsys
def test_the_files_a_report_is_read_through_are_never_outputs(capture, tmp_path):
    raw = tmp_path / "run.qdstrm"
    shutil.copyfile(capture, raw)
    kept = digests(raw)
    for name in ("run.sqlite", "run.nsys-rep"):  # what importing and exporting it make beside it
        one_line(run_cli("analyze", raw, "--json", tmp_path / name, "--force"), name, "read through")
    assert digests(raw) == kept and sorted(p.name for p in tmp_path.iterdir()) == ["run.qdstrm"]
    rep = tmp_path / "r.nsys-rep"
    rep.write_bytes(b"\0" * 16)  # the check comes before nsys reads it
    one_line(run_cli("analyze", rep, "--html", tmp_path / "r.sqlite"), "r.sqlite", "read through")
    one_line(run_cli("redact", SMALL, "-o", f"{SMALL}-journal", "--force"), "read through")
    assert not Path(f"{SMALL}-journal").exists()


def _script(folder: Path) -> tuple[Path, Path]:
    marker = folder / "ran"
    script = folder / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return script, marker


def test_try_never_writes_its_from_run_or_its_own_files_twice(runs, tmp_path):
    before, _ = runs
    script, marker = _script(tmp_path)
    kept = digests(before, script)
    out = tmp_path / "out"
    (out / "baseline").mkdir(parents=True)
    shutil.copyfile(before / "summary.json", out / "baseline" / "summary.json")
    kept.update(digests(out))
    cases = [
        (["--from", before, "--json", before / "summary.json", "--force"], "inside"),
        (["--from", before / "summary.json", "--json", before / "summary.json", "--force"], "the same file"),
        (["--from", out / "baseline", "--out", out, "--force"], "--from"),  # try rewrites baseline/summary.json
        (["--from", before, "--out", before / "try"], "--out"),
        (["--out", tmp_path / "t2", "--json", tmp_path / "t2" / "try.html"], "--json"),
        (["--out", out], "already holds baseline"),  # an earlier try's variant, without --force
    ]
    for args, needle in cases:
        one_line(run_cli("try", *args, "tf32=1", script), needle, code=2)
    assert not marker.exists() and digests(before, script, out) == kept
    assert not (before / "try").exists() and not (tmp_path / "t2").exists()


def test_run_refuses_a_history_that_is_an_export_its_script_or_one_of_its_outputs(runs, tmp_path):
    """`run --history X.sqlite` wrote runs/findings tables into an nsys export: now refused before it runs."""
    before, _ = runs
    script, marker = _script(tmp_path)
    kept = digests(before, script)
    out = tmp_path / "out"
    cases = [
        (before / "report.sqlite", "not an nvtx-trace run history"),
        (script, "is the input"),
        (out / "report.sqlite", "a file this command writes"),
        (out / "summary.json", "a file this command writes"),
        (out / "rank3.sqlite", "a file this command writes"),
        (before, "is a directory"),
        (Path("/dev/null"), "not a regular file"),
    ]
    for path, needle in cases:
        one_line(run_cli("run", "--out", out, "--history", path, "--no-autotrace", script), needle, code=2)
    assert not marker.exists() and not out.exists() and digests(before, script) == kept
    with sqlite3.connect(f"file:{before / 'report.sqlite'}?mode=ro", uri=True) as con:
        assert not {"runs", "findings"} & {r[0] for r in con.execute("SELECT name FROM sqlite_master")}


def test_outputs_get_the_mode_a_plain_file_would_and_no_temporary_file(tmp_path):
    """Atomic writes go through mkstemp (mode 0600): the summary must still be readable as any file is."""
    out = tmp_path / "s.json"
    proc = run_cli("analyze", SMALL, "--json", out, "--html", tmp_path / "s.html")
    assert proc.returncode == 0, proc.stderr
    mask = os.umask(0)
    os.umask(mask)
    assert (out.stat().st_mode & 0o777) == (0o666 & ~mask) == ((tmp_path / "s.html").stat().st_mode & 0o777)
    assert leftovers(tmp_path) == []


# ================================================================ write failures


def test_json_and_html_into_a_full_disk_are_one_line_and_leave_nothing(tmpfs):
    full = tmpfs("64k")
    for option, name in (("--html", "s.html"), ("--json", "s.json")):
        fill(full, leave=2048 if option == "--json" else 64 << 10)
        proc = run_cli("analyze", SMALL, option, full / name)
        one_line(proc, f"cannot write {full / name}", "disk is full", code=1)
        assert leftovers(full) == [] and not (full / name).exists()
        (full / "filler").unlink()


def test_an_existing_output_stays_whole_when_its_replacement_does_not_fit(tmpfs):
    full = tmpfs("64k")
    old = full / "s.json"
    old.write_text('{"earlier": true}\n')
    fill(full, leave=1024)
    one_line(run_cli("analyze", SMALL, "--json", old, "--force"), "disk is full")
    assert old.read_text() == '{"earlier": true}\n' and leftovers(full) == []


def test_the_file_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE (ulimit -f), which needs no root: summary.html is megabytes."""
    proc = run_cli("analyze", SMALL, "--html", tmp_path / "s.html", preexec_fn=file_size_limit(256 << 10))
    one_line(proc, "s.html", "file-size limit", code=1)
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.nsys
def test_run_whose_html_summary_hits_the_file_size_limit_keeps_the_rest(tmp_path):
    """A real `run` (nsys, a 12-step NVTX program) under a 2 MB file-size limit: the report, its export and
    summary.json fit, the multi-MB summary.html does not: one line names it, exit 1, no partial page."""
    installed_nsys()
    program = tmp_path / "steps.py"
    program.write_text("import time, nvtx\nfor i in range(12):\n    with nvtx.annotate(f'step {i}'):\n"
                       "        time.sleep(0.01)\n")
    out = tmp_path / "out"
    proc = run_cli("run", "--no-autotrace", "--trace", "nvtx", "--no-history", "--out", out, program,
                   preexec_fn=file_size_limit(2 << 20))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    flat = " ".join(proc.stderr.split())  # run's problem lines are wrapped at the console's width
    assert flat.count("cannot write") == 1 and "summary.html: the file-size limit was reached" in flat, flat
    assert sorted(p.name for p in out.iterdir()) == ["nsys.log", "report.nsys-rep", "report.sqlite", "summary.json"]
    assert json.loads((out / "summary.json").read_text())["steps"]["summary"]["steps"] == 12


@pytest.mark.nsys
def test_run_into_a_full_stdout_keeps_its_files_and_its_history_row(tmp_path):
    installed_nsys()
    program = tmp_path / "steps.py"
    program.write_text("import time, nvtx\nfor i in range(6):\n    with nvtx.annotate(f'step {i}'):\n"
                       "        time.sleep(0.01)\n")
    db, out = tmp_path / "h.db", tmp_path / "out"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", "--no-autotrace", "--trace", "nvtx",
                               "--history", str(db), "--out", str(out), str(program)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and errors[0].startswith("nvtx-trace: error: cannot write to stdout"), proc.stderr
    assert json.loads((out / "summary.json").read_text())["steps"]["summary"]["steps"] == 6
    listed = run_cli("history", "--history", db, "--json")
    assert [r["out_dir"] for r in json.loads(listed.stdout)["runs"]] == [str(out)]


@pytest.mark.parametrize("where", ["read_only_mount", "proc", "proc_self"])
def test_outputs_into_folders_that_take_no_files_are_refused_before_any_work(tmpfs, where):
    folder = {"read_only_mount": lambda: tmpfs("64k", read_only=True), "proc": lambda: Path("/proc"),
              "proc_self": lambda: Path("/proc/self")}[where]()
    for args in (["analyze", SMALL, "--json", folder / "s.json"], ["analyze", SMALL, "--html", folder / "s.html"],
                 ["redact", SMALL, "-o", folder / "r.sqlite"], ["diff", SMALL, OTHER, "--html", folder / "d.html"]):
        line = one_line(run_cli(*args), str(folder), code=2)
        assert "export it again" not in line and str(SMALL) not in line


def test_redact_into_a_full_disk_blames_the_output_not_the_input(tmpfs):
    full = tmpfs("256k")
    kept = digests(SMALL)
    line = one_line(run_cli("redact", SMALL, "-o", full / "r.sqlite"), f"cannot write {full / 'r.sqlite'}",
                    "disk is full", code=1)
    assert "export it again" not in line
    assert digests(SMALL) == kept and sorted(p.name for p in full.iterdir()) == []


def test_diff_and_try_outputs_into_a_full_disk_or_read_only_mount(runs, tmpfs, tmp_path):
    before, after = runs
    full = tmpfs("64k")
    fill(full, leave=512)
    one_line(run_cli("diff", before, after, "--html", full / "d.html"), "disk is full", code=1)
    assert sorted(p.name for p in full.iterdir()) == ["filler"]
    ro = tmpfs("64k", read_only=True)
    script, marker = _script(tmp_path)
    one_line(run_cli("try", "--json", ro / "t.json", "tf32=1", script), "read-only file system", code=2)
    one_line(run_cli("try", "--out", ro / "t", "tf32=1", script), "read-only file system", code=2)
    assert not marker.exists()


@pytest.mark.parametrize("args", [["analyze", SMALL, "--json", "-"], ["analyze", SMALL], ["history", "--json"],
                                  ["history"]])
def test_a_full_or_closed_stdout_is_one_line(args):
    command = [sys.executable, "-m", "nvtx_trace.cli", *map(str, args)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    proc.stdout = ""
    one_line(proc, "cannot write to stdout", code=1)
    closed = subprocess.run(command, stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=lambda: os.close(1))
    closed.stdout = ""
    one_line(closed, "cannot write to stdout", "closed", code=1)


def test_files_are_written_whole_before_a_stdout_that_fails(tmp_path):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "redact", str(SMALL), "-o",
                               str(tmp_path / "r.sqlite")], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300)
    proc.stdout = ""
    one_line(proc, "stdout", code=1)
    with sqlite3.connect(tmp_path / "r.sqlite") as con:
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    assert leftovers(tmp_path) == []


def test_a_reader_that_leaves_ends_the_command_quietly_after_the_files(tmp_path):
    """`| head -1`: not a fault to report, but not success either (141, as for SIGPIPE); the file is whole."""
    out = tmp_path / "s.json"
    producer = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(SMALL), "--json", "-",
                                 "--html", str(tmp_path / "s.html")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    producer.stdout.close()  # the reader leaves before the first byte
    err = producer.stderr.read().decode()
    assert producer.wait(timeout=300) == 141 and "Traceback" not in err and "error" not in err, err
    assert (tmp_path / "s.html").stat().st_size > 100_000 and not out.exists() and leftovers(tmp_path) == []


def test_a_write_killed_midway_leaves_the_old_file_whole(tmp_path):
    """SIGKILL while the HTML page is being written: the page is the old one or the whole new one, never half
    (a temporary file and a rename, never a rewrite in place)."""
    page = tmp_path / "s.html"
    page.write_text("<html>earlier</html>")
    proc = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(OTHER), "--html", str(page),
                             "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not any(p.name.endswith(".tmp")
                                                                      for p in tmp_path.iterdir()):
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    text = page.read_text()
    assert text == "<html>earlier</html>" or (len(text) > 100_000 and text.rstrip().endswith("</html>"))
