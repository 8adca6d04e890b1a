"""nvtx_trace.capture against the real nsys on this machine: find it, profile a tiny NVTX
program, import the .qdstrm when nsys cannot, export and read the range back with SQL."""

from __future__ import annotations

import hashlib
import importlib.util
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
from conftest import ROOT, again_after_nsys_fault, ctrl_c_when, installed_nsys, need

from nvtx_trace.capture import export, locate, qdstrm
from nvtx_trace.capture import profile as profiling
from nvtx_trace.errors import BadReportError, NsysFailedError, NsysNotFoundError

RANGE = "nvtx_trace_test_range"
PROGRAM = f"""
import sys, time, nvtx
with nvtx.annotate("{RANGE}"):
    time.sleep(0.05)
print("program says hello", flush=True)
sys.exit(3)
"""


def nvtx_ranges(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT COALESCE(s.value, n.text) FROM NVTX_EVENTS n "
            "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60) ORDER BY n.start"
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


@pytest.fixture
def no_nsys_anywhere(monkeypatch):
    """A machine without nsys: empty PATH, no $NSYS, no known install locations."""
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr(locate, "KNOWN_LOCATIONS", ())


@pytest.fixture(scope="module")
def real_nsys() -> locate.Nsys:
    found = installed_nsys()
    return found


@pytest.fixture(scope="module")
def profiled(real_nsys, tmp_path_factory):
    """One real profile of PROGRAM, shared by the tests below (nsys runs are slow)."""
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    work = tmp_path_factory.mktemp("profile")
    (work / "prog.py").write_text(PROGRAM)
    return again_after_nsys_fault(lambda: profiling.profile(
        real_nsys, [sys.executable, "prog.py"], work / "run",
        trace=locate.pick_traces(real_nsys, ["nvtx"]),
        extra=["--sample=none", "--cpuctxsw=none"], cwd=work, capture_output=True,
    ))


# ---------------------------------------------------------------- version parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("NVIDIA Nsight Systems version 2022.4.2.1-df9881f", "2022.4.2"),
        ("NVIDIA Nsight Systems version 2025.3.2.0-253236166481v0\n", "2025.3.2"),
        ("NVIDIA Nsight Systems 2022.4.2.1-df9881f", "2022.4.2"),  # QdstrmImporter --version
        ("NVIDIA Nsight Systems version 2025.3.1.0", "2025.3.1"),
        ("GPU 0: NVIDIA H100\nNVIDIA Nsight Systems version 2024.7.1.84-247134859722v0", "2024.7.1"),
        ("nsys: command not found", None),
        ("", None),
    ],
)
def test_parse_version_takes_the_leading_year_dot_n_dot_n(text, expected):
    assert locate.parse_version(text) == expected


def test_traces_are_read_from_a_2025_profile_help(monkeypatch):
    help_2025 = textwrap.dedent("""\
        \t-t, --trace=

        \t   Possible values are 'cuda', 'cuda-hw', 'nvtx', 'cublas', 'cublas-verbose',
        \t   'cusolver', 'cusolver-verbose', 'cusparse', 'cusparse-verbose', 'mpi',
        \t   'oshmem', 'ucx', 'osrt', 'cudnn', 'opengl', 'opengl-annotations', 'openacc',
        \t   'openmp', 'nvvideo', 'vulkan', 'vulkan-annotations', 'python-gil',
        \t   'gds'(experimental) or 'none'.
        \t   Select the API(s) to trace. Multiple APIs can be selected, separated by commas only

        \t--trace-fork-before-exec=
        """)
    monkeypatch.setattr(locate, "_profile_help", lambda path: help_2025)
    fake = locate.Nsys(Path("/x/nsys"), "2025.3.1", "test")
    traces = locate.supported_traces(fake)
    assert {"cuda", "nvtx", "osrt", "cudnn", "cublas", "python-gil", "gds"} <= traces
    assert "none" not in traces
    assert "--trace-fork-before-exec" in locate.supported_options(fake)
    assert locate.pick_traces(fake, ["cuda", "nvtx", "nope"]) == ["cuda", "nvtx"]


# ---------------------------------------------------------------- finding nsys


def test_finds_the_installed_nsys_with_a_matching_importer(real_nsys):
    out = subprocess.run([str(real_nsys.path), "--version"], capture_output=True, text=True).stdout
    assert real_nsys.version == locate.parse_version(out)
    assert real_nsys.importer is not None and real_nsys.importer_problem is None, real_nsys.importer_problem
    if real_nsys.importer_version and locate.parse_version(real_nsys.importer_version):
        assert real_nsys.importer_version == real_nsys.version  # 2025.3 importers print only a build number


def test_explicit_nsys_accepts_a_binary_or_its_directory(real_nsys):
    by_file = locate.find_nsys(str(real_nsys.path))
    by_dir = locate.find_nsys(str(real_nsys.path.resolve().parent))
    assert by_file.found_via == by_dir.found_via == "--nsys"
    assert by_file.version == by_dir.version == real_nsys.version


def test_nsys_env_variable_is_used(real_nsys, monkeypatch):
    monkeypatch.setenv("NSYS", str(real_nsys.path))
    monkeypatch.setenv("PATH", "")
    assert locate.find_nsys().found_via == "$NSYS"


def test_bogus_explicit_nsys_is_an_error_not_a_fallback(tmp_path):
    with pytest.raises(NsysNotFoundError, match="--nsys"):
        locate.find_nsys(str(tmp_path / "nope" / "nsys"))
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\necho broken >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(NsysNotFoundError, match="not a working nsys"):
        locate.find_nsys(str(fake))


def test_bogus_nsys_env_variable_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("NSYS", str(tmp_path / "missing"))
    with pytest.raises(NsysNotFoundError, match=r"\$NSYS"):
        locate.find_nsys()


def test_no_nsys_anywhere_says_how_to_install_it(no_nsys_anywhere):
    with pytest.raises(NsysNotFoundError) as err:
        locate.find_nsys()
    message = str(err.value)
    assert "nsight-systems" in message and "--nsys" in message and "$NSYS" in message
    assert "\n" not in message


# ---------------------------------------------------------------- profile, import, export


def test_profile_makes_a_report_even_when_nsys_cannot_import(profiled):
    assert profiled.rep is not None, profiled.problem
    assert profiled.rep.name == "run.nsys-rep" and profiled.rep.stat().st_size > 0
    assert profiled.returncode == 3  # the program's exit status passes through
    assert "program says hello" in profiled.log
    if "Importer error" in profiled.log:  # Debian layout: nsys left only the .qdstrm
        assert profiled.imported_by_us


def test_exported_sqlite_holds_the_nvtx_range(real_nsys, profiled):
    db = export.export_sqlite(real_nsys, profiled.rep)
    assert db == profiled.rep.with_name("run.sqlite")
    assert export.is_sqlite(db)
    assert RANGE in nvtx_ranges(db)
    assert not list(db.parent.glob(".*partial*")), "temporary export left behind"


def test_ensure_sqlite_exports_a_report_once_and_leaves_it_untouched(real_nsys, profiled, tmp_path):
    rep = tmp_path / "copy.nsys-rep"
    shutil.copy(profiled.rep, rep)
    before = rep.read_bytes()
    db = export.ensure_sqlite(rep, real_nsys)
    assert db == tmp_path / "copy.sqlite" and RANGE in nvtx_ranges(db)
    stamp = db.stat().st_mtime_ns
    assert export.ensure_sqlite(rep, real_nsys) == db  # fresh: reused
    assert db.stat().st_mtime_ns == stamp
    assert rep.read_bytes() == before
    assert export.ensure_sqlite(db) == db


def test_ensure_sqlite_leaves_a_newer_but_broken_export_and_exports_to_the_cache(real_nsys, profiled, tmp_path,
                                                                                  monkeypatch):
    """What an interrupted `nsys export` leaves is not ours to replace (ours are written whole, then renamed): an
    export goes beside the report only where the name is free or holds our own export of exactly that report."""
    rep = tmp_path / "r.nsys-rep"
    shutil.copy(profiled.rep, rep)
    garbage = tmp_path / "r.sqlite"
    garbage.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)  # what an interrupted export leaves
    os.utime(rep, (time.time() - 60, time.time() - 60))
    assert not export.is_sqlite(garbage)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = export.ensure_sqlite(rep, real_nsys)
    assert db != garbage and export.is_sqlite(db) and RANGE in nvtx_ranges(db)
    assert garbage.read_bytes() == b"SQLite format 3\x00" + b"\x00" * 100


def test_ensure_sqlite_never_trusts_or_overwrites_an_export_it_did_not_make_from_this_report(
    real_nsys, profiled, tmp_path, monkeypatch
):
    """A newer, valid, unrelated r.sqlite beside r.nsys-rep: not analyzed as if it were r's, and not replaced."""
    rep = tmp_path / "r.nsys-rep"
    shutil.copy(profiled.rep, rep)
    other = tmp_path / "r.sqlite"
    shutil.copy(ROOT / "sample_reports" / "cpu_slow_loader.sqlite", other)
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = export.ensure_sqlite(rep, real_nsys)
    assert db != other and (tmp_path / "cache" / "nvtx-trace") in db.parents and RANGE in nvtx_ranges(db)
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before
    assert export.ensure_sqlite(rep, real_nsys) == db  # ours, from this report: reused
    rep.write_bytes(rep.read_bytes() + b"\0")  # the report changed: its old export is not reused
    assert not export._fresh_sqlite(db, rep)


def test_ensure_sqlite_exports_to_the_cache_when_the_directory_is_read_only(
    real_nsys, profiled, tmp_path, monkeypatch
):
    rep = tmp_path / "ro" / "r.nsys-rep"
    rep.parent.mkdir()
    shutil.copy(profiled.rep, rep)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(export, "_writable", lambda d: Path(d) != rep.parent)
    db = export.ensure_sqlite(rep, real_nsys)
    assert (tmp_path / "cache" / "nvtx-trace") in db.parents
    assert sorted(p.name for p in rep.parent.iterdir()) == ["r.nsys-rep"]
    assert export.ensure_sqlite(rep, real_nsys) == db


def test_ensure_sqlite_imports_a_bare_qdstrm(real_nsys, profiled, tmp_path):
    if profiled.qdstrm is None:
        pytest.skip("this nsys imported the capture itself and removed the .qdstrm")
    qd = tmp_path / "only.qdstrm"
    shutil.copy(profiled.qdstrm, qd)
    db = export.ensure_sqlite(qd, real_nsys)
    assert db == tmp_path / "only.sqlite" and RANGE in nvtx_ranges(db)
    stamp = db.stat().st_mtime_ns
    assert export.ensure_sqlite(qd, real_nsys) == db and db.stat().st_mtime_ns == stamp  # made from it: reused


@pytest.mark.parametrize("other_is", ["older", "newer"])
def test_a_qdstrm_beside_another_report_of_its_name_never_touches_or_reads_it(real_nsys, profiled, tmp_path,
                                                                               monkeypatch, other_is):
    """Issue 52, item 1: beside an older real report of the same name, the import replaced the user's .nsys-rep;
    beside a newer unrelated one, that report was analyzed in the capture's place. The other report here is an
    empty file's export: no NVTX range of the capture's, so reading it would lose RANGE."""
    import os

    if profiled.qdstrm is None:
        pytest.skip("this nsys imported the capture itself and removed the .qdstrm")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    qd = tmp_path / "cap.qdstrm"
    shutil.copy(profiled.qdstrm, qd)
    other = tmp_path / "cap.nsys-rep"
    other.write_bytes(export.REPORT_MAGIC + b" somebody else's report")
    stamp = qd.stat().st_mtime + (-100 if other_is == "older" else 100)
    os.utime(other, (stamp, stamp))
    before = other.read_bytes()
    db = export.ensure_sqlite(qd, real_nsys)
    assert RANGE in nvtx_ranges(db)  # the capture's own
    assert other.read_bytes() == before and other.stat().st_mtime == stamp  # the user's report as it was


def test_ensure_sqlite_without_nsys_says_where_to_export(profiled, tmp_path, no_nsys_anywhere):
    rep = tmp_path / "r.nsys-rep"
    shutil.copy(profiled.rep, rep)
    with pytest.raises(NsysNotFoundError) as err:
        export.ensure_sqlite(rep)
    assert f"nsys export --type sqlite {rep}" in str(err.value)
    assert "is a .nsys-rep" in str(err.value)


def test_ensure_sqlite_rejects_missing_and_non_sqlite_inputs(tmp_path):
    with pytest.raises(BadReportError, match="no such file"):
        export.ensure_sqlite(tmp_path / "missing.sqlite")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(BadReportError):
        export.ensure_sqlite(text)


def test_failed_export_raises_with_the_nsys_message_and_leaves_nothing(real_nsys, tmp_path):
    rep = tmp_path / "bad.nsys-rep"
    rep.write_bytes(b"not a report")
    with pytest.raises(NsysFailedError, match="no valid SQLite"):
        export.export_sqlite(real_nsys, rep)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.nsys-rep"]


def test_import_without_an_importer_says_where_the_capture_is(tmp_path):
    fake = locate.Nsys(Path("/x/nsys"), "2022.4.2", "test", importer_problem="no QdstrmImporter found")
    with pytest.raises(NsysFailedError, match="left as .*x.qdstrm"):
        qdstrm.import_qdstrm(fake, tmp_path / "x.qdstrm")


INTERRUPTED = """
import json, sys
from nvtx_trace.capture.locate import find_nsys
from nvtx_trace.capture.profile import profile
n = find_nsys()
r = profile(n, [sys.executable, "loop.py"], "loop", trace=["nvtx"],
            extra=["--sample=none", "--cpuctxsw=none"])
print("RESULT " + json.dumps({"rc": r.returncode, "rep": str(r.rep) if r.rep else None,
                              "interrupted": r.interrupted, "problem": r.problem}), flush=True)
"""
LOOP = """
import sys, time, nvtx
for i in range(600):
    with nvtx.annotate("loop_step"):
        time.sleep(0.05)
    print("step", i, file=sys.stderr, flush=True)
"""


def test_ctrl_c_is_forwarded_once_and_the_report_is_kept(real_nsys, tmp_path):
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    (tmp_path / "run.py").write_text(INTERRUPTED)
    (tmp_path / "loop.py").write_text(LOOP)
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, NSYS=str(real_nsys.path), PYTHONPATH=path)
    child = subprocess.Popen([sys.executable, "run.py"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, _ = ctrl_c_when(child, "step 5", timeout=120)
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    assert result["interrupted"] and result["rep"], result
    db = export.export_sqlite(real_nsys, result["rep"])
    assert "loop_step" in nvtx_ranges(db)
