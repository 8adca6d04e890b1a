"""Issue 52: what the tool prints and writes is never lost to a name or a terminal, nor a report misread. An
ASCII-only stdout (PYTHONIOENCODING=ascii) lost the whole report at its first "µ"; a legal 255-byte --json name
passed the check up front, then failed after the analysis (the temporary name beside it was too long)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import SAMPLES

GPT2 = SAMPLES / "gpt2_window_h100.sqlite"


def _analyze(tmp_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(GPT2), *args], cwd=tmp_path,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=300)


def test_an_ascii_terminal_gets_the_whole_report_spelled_in_ascii(tmp_path):
    utf8 = _analyze(tmp_path, env={"PYTHONIOENCODING": "utf-8"})
    ascii_ = _analyze(tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert utf8.returncode == 0 and ascii_.returncode == 0, ascii_.stderr.decode(errors="replace")[-500:]
    text = ascii_.stdout.decode("ascii")  # every byte is ASCII
    full = utf8.stdout.decode("utf-8")
    assert "µs" in full and " us " in text
    assert len(text.splitlines()) == len(full.splitlines())  # every line of it
    plain = [ln for ln in full.splitlines() if ln.isascii() or set(ln) - set("µ") <= set(map(chr, range(128)))]
    assert plain and all(ln.replace("µ", "u") in text.splitlines() for ln in plain)  # µ spelled u, the rest as is


def test_a_255_byte_json_name_is_written(tmp_path):
    name = "j" * 250 + ".json"
    proc = _analyze(tmp_path, "--json", name)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-500:]
    assert json.loads((tmp_path / name).read_text())["findings"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary file left beside it


@pytest.mark.nsys
@pytest.mark.slow
def test_a_script_name_near_the_file_name_limit_gets_a_default_folder_that_fits(tmp_path):
    """Issue 52, item 7: a 243-byte script name made the default output folder (name, time stamp) longer than
    the file-name limit: an OSError traceback in run, try and tune. The folder's stem is cut to fit."""
    from conftest import installed_nsys

    from nvtx_trace.runner import plan

    installed_nsys()
    script = tmp_path / ("s" * 240 + ".py")
    script.write_text("print('hi')\n")
    for stem in (plan.run_name([script.name], "script"), plan.run_name([script.name], "script") + "-tune"):
        assert len(plan.fresh_folder(tmp_path / "out", stem).name) <= 255
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "run", script.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr and "File name too long" not in proc.stderr, proc.stderr[-800:]
    (folder,) = (tmp_path / "nvtx-trace-out").iterdir()
    assert folder.name.startswith("s" * 100 + "-") and (folder / "report.nsys-rep").is_file()


@pytest.mark.nsys
@pytest.mark.slow
@pytest.mark.parametrize("verb", ["run", "tune"])
def test_a_script_name_s_control_characters_never_reach_the_terminal(tmp_path, verb):
    """Issue 52, item 11: an ESC or BEL in a script's name reached the terminal raw (the echoed nsys command,
    tune's header, "Wrote NAME"): a name could retitle the window or forge a line. Each is shown escaped."""
    from conftest import installed_nsys

    installed_nsys()
    script = tmp_path / "a\x1b]0;owned\x07b.py"
    script.write_text("print('hi')\n")
    args = ["--budget", "120"] if verb == "tune" else []
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", verb, *args, script.name], cwd=tmp_path,
                          capture_output=True, timeout=600)
    said = proc.stdout + proc.stderr
    assert b"a\\x1b]0;owned\\x07b.py" in said, said.decode(errors="replace")[-1500:]  # named, escaped
    assert b"\x1b" not in said and b"\x07" not in said


def test_a_kernel_table_without_times_is_refused_not_analyzed_as_no_kernels(tmp_path):
    """Issue 52, item 3: a crafted export whose kernel table had lost its start column was analyzed as one with no
    kernels (GPU busy <1 %, a launch-bound finding) without a word. A real H100 export, that column renamed."""
    import hashlib
    import shutil
    import sqlite3

    report = tmp_path / "crafted.sqlite"
    shutil.copy(GPT2, report)
    with sqlite3.connect(report) as conn:
        conn.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN start TO begin")
    digest = hashlib.sha256(report.read_bytes()).hexdigest()
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(report)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and proc.stdout == "", proc.stdout[-500:]
    assert proc.stderr.strip().splitlines() == [
        f"nvtx-trace: error: {report}: CUPTI_ACTIVITY_KIND_KERNEL has no start column, so its kernel rows have no "
        "times; export the report again with nsys"]
    assert hashlib.sha256(report.read_bytes()).hexdigest() == digest


def test_the_framing_lines_fit_80_columns_on_a_terminal_and_stay_one_line_in_a_log():
    """Issue 52, item 14: the nsys command and "profiling a window ..." ran 300-400 characters on, broken mid-word
    at 80 columns. On a terminal they wrap at words (the command with shell continuations: pasted, it runs);
    in a log or a pipe each stays one line."""
    import io
    import shlex

    from rich.console import Console

    from nvtx_trace.report.console import command_lines, framing

    argv = ["/opt/nvidia/nsight-systems/2025.3.1/bin/nsys", "profile", "-o", "/tmp/my runs/report", "-f", "true",
            "-t", "cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "/usr/bin/python3",
            "-m", "nvtx_autotrace", "train.py", "--epochs", "1", "--data", "/data/imagenet train"]
    lines = command_lines(argv, 80)
    assert len(lines) > 1 and all(len(x) <= 80 for x in lines)
    assert shlex.split(" ".join(x.removesuffix(" \\") for x in lines).removeprefix("$ ")) == argv
    text = "nvtx-trace: profiling a window chosen after warm-up (the step pace settled; at least 20 steps) " * 3
    tty, log = io.StringIO(), io.StringIO()
    framing(Console(file=tty, force_terminal=True, width=80, color_system=None), text)
    framing(Console(file=log, force_terminal=False, width=80), text)
    wrapped = tty.getvalue().splitlines()
    assert len(wrapped) > 1 and all(len(x) <= 80 for x in wrapped) and wrapped[1].startswith("    ")
    assert log.getvalue() == text + "\n"
