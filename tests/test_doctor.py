"""`nvtx-trace doctor` on this machine: what it finds, and that it fails when `run` could not work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT, need

from nvtx_trace.capture import locate
from nvtx_trace.cli import doctor as doc
from nvtx_trace.cli import main


@pytest.fixture
def no_nsys_anywhere(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr(locate, "KNOWN_LOCATIONS", ())


def by_name(checks):
    return {c.name: c for c in checks}


def test_doctor_lists_nsys_importer_torch_and_nvtx_and_exits_zero(nsys_path, torch_module, capsys):
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    found = locate.find_nsys()
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"{found.version} at {found.path}" in out
    assert "importer" in out and str(found.importer) in out
    assert torch_module.__version__ in out
    assert "Ready" in out


def test_doctor_fails_and_says_how_to_install_when_nsys_is_missing(no_nsys_anywhere, capsys):
    assert main(["doctor"]) == 1
    captured = capsys.readouterr()
    assert "MISSING  nsys" in captured.out and "nsight-systems" in captured.out
    assert "fix nsys" in captured.err


def test_doctor_fails_for_a_python_that_does_not_run(tmp_path, capsys):
    assert main(["doctor", "--python", str(tmp_path / "no-python")]) == 1
    assert "MISSING  python" in capsys.readouterr().out


def test_split_layout_import_step_is_reported_as_handled(nsys_path):
    found = locate.find_nsys()
    step = by_name(doc.check_nsys(None)[0])["import step"]
    assert step.status == doc.OK
    if not found.imports_itself:
        assert "nvtx-trace runs the importer itself" in step.detail


@pytest.mark.parametrize(
    "nvtx, nsys, recorded",
    [("0.2.11", "2022.4.2", True), ("0.2.12", "2022.4.2", False), ("0.2.17", "2022.4.2", False),
     ("0.2.14", "2025.3.1", True), ("0.2.11", "2025.3.2", True)],
)
def test_nvtx_releases_that_old_nsys_does_not_record_are_flagged(nvtx, nsys, recorded):
    problem = locate.nvtx_problem(nvtx, nsys)
    assert (problem is None) == recorded
    if problem:
        assert "nvtx==0.2.11" in problem


def test_incompatible_nvtx_blocks_run(monkeypatch):
    monkeypatch.setattr(doc, "probe_python", lambda python: {"python": "3.11", "nvtx": "0.2.13", "torch": None})
    fake = locate.Nsys(ROOT / "nsys", "2022.4.2", "test")
    checks = by_name(doc.check_python("python", fake))
    assert checks["nvtx"].blocking and checks["torch"].blocking


def test_doctor_does_not_import_torch_in_its_own_process():
    code = ("import sys; from nvtx_trace.cli import doctor; doctor.check_python(sys.executable, None); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.parametrize("during", [b"probe.py", b"export"], ids=["capture", "export"])
def test_a_signal_during_the_probe_ends_doctor_with_one_line(nsys_path, during, tmp_path):
    """Told to stop while its probe's nsys captures or exports, doctor stops too: 128 + the signal and one
    line, not a report of checks nor a line about a stage it never reached. The probe's export takes some
    10 ms here (a clean-clone CI run missed it): it is reached through a stand-in nsys that waits before
    exporting, as a big report's export takes long."""
    import os
    import signal
    import time

    from nvtx_trace.capture import processes

    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    wrapper = tmp_path / "nsys"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = export ]; then sleep 30; fi\nexec {nsys_path} "$@"\n')
    wrapper.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "doctor", "--probe", "--nsys", str(wrapper)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not any(
                during in _cmdline(p) for p in processes.descendants(proc.pid)):
            time.sleep(0.01)
        assert proc.poll() is None, "doctor ended before its nsys was seen"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 143 and lines == ["nvtx-trace: interrupted (SIGTERM)"], (proc.returncode, err, out)
    left = [p for p, _, _ in processes.live_processes() if str(tmp_path).encode() in _cmdline(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the probe's nsys outlived doctor"


def test_probe_runs_a_real_capture_and_reads_the_range_back(nsys_path):
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    found = locate.find_nsys()
    check = doc.probe_capture(found, sys.executable)
    assert check.status == doc.OK, check.detail


def test_doctor_says_where_the_lines_of_syncs_come_from_and_why_not_from_nsys():
    """Issue 43, item 3: this nsys's own backtrace options, read from its help, and what they were measured to give."""
    from nvtx_trace.cli import doctor as doc

    older = doc.source_lines(frozenset({"--trace", "--sample"}))
    newer = doc.source_lines(frozenset({"--trace", "--python-backtrace", "--cudabacktrace"}))
    assert "named by line" in older.detail and "records no Python backtraces" in older.detail
    assert "--python-backtrace=cuda" in newer.detail and "stays off" in newer.detail
    assert not older.required and not newer.required


@pytest.mark.parametrize("content", [b"#!/bin/sh\nexit 0\n", b"\x00\x01 not a program"])
def test_an_nsys_that_is_not_nsys_is_said_with_what_to_do_and_its_name_escaped(content, tmp_path, monkeypatch, capsys):
    """Issue 52, items 10 and 11: $NSYS naming a script or a file that is no program got "not a working nsys" and no
    what-to-do; a name with an escape sequence reached the terminal raw."""
    fake = tmp_path / "nsys\x1b[2J"
    fake.write_bytes(content)
    fake.chmod(0o755)
    monkeypatch.setenv("NSYS", str(fake))
    assert main(["doctor"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.lstrip().startswith("MISSING  nsys"))
    assert "is not a working nsys" in line and "point $NSYS (or --nsys) at the nsys binary" in line
    assert "\x1b" not in line and "nsys\\x1b[2J" in line
