"""`nvtx-trace redact`: secrets gone, analysis data identical, input untouched, bad input refused.

Runs on real exports only: one captured live here under the installed nsys with a
planted secret (environment variable, argument, stdout, working directory), and the
shipped sample_reports/*.sqlite, which are redacted already, so redacting them
again must change nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import secrets
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, need

from nvtx_trace import cli
from nvtx_trace.errors import BadReportError, UsageError
from nvtx_trace.runner.redact import REDACTED, parse_environment, redact

SECRET = f"hunter2-{secrets.token_hex(8)}"
PROGRAM = """\
import os, sys
import nvtx
print("token", os.environ["NVTX_TRACE_TEST_SECRET"], sys.argv[1:])
with nvtx.annotate("redact-test-range"):
    sum(range(1000))
"""
# Tables whose every row analyses may read: they must come out identical.
ANALYSIS_TABLE = re.compile(r"^(CUPTI_|NVTX_|ENUM_|ThreadNames$|ANALYSIS_DETAILS$|OSRT_API$|PROFILER_OVERHEAD$)")
SHIPPED = sorted(SAMPLES.glob("*.sqlite"))
_live: dict[str, Path] = {}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro&immutable=1", uri=True)


def tables(db: sqlite3.Connection) -> list[str]:
    return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]


def rows(db: sqlite3.Connection, table: str) -> list[tuple]:
    return db.execute(f'SELECT * FROM "{table}" ORDER BY rowid').fetchall()


def text_cells(db: sqlite3.Connection):
    """(table, column, text) for every text or blob cell of every table, NUL bytes and all."""
    for table in tables(db):
        cols = [r[1] for r in db.execute(f'PRAGMA table_info("{table}")')]
        for row in db.execute(f'SELECT * FROM "{table}"'):
            for col, value in zip(cols, row):
                if isinstance(value, bytes):
                    value = value.decode("utf-8", "replace")
                if isinstance(value, str):
                    yield table, col, value


def environment_of(db: sqlite3.Connection) -> dict[str, str]:
    """The capture's environment as the original export holds it (any of its three places)."""
    env: dict[str, str] = {}
    names = set(tables(db))
    if "TARGET_INFO_SYSTEM_ENV" in names:
        for (v,) in db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'"):
            env.update(parse_environment(v))
    if "META_DATA_CAPTURE" in names:
        for (v,) in db.execute("SELECT value FROM META_DATA_CAPTURE WHERE instr(name, 'ENVIRONMENT') > 0"):
            env.update(parse_environment(v))
    for (v,) in db.execute("SELECT value FROM StringIds"):
        if re.match(r"^[A-Za-z_]\w*=", v):
            env.update(parse_environment(v))
    return env


def hostnames_of(db: sqlite3.Connection) -> set[str]:
    found = set()
    if "TARGET_INFO_SYSTEM_ENV" in tables(db):
        found |= {v for (v,) in db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")}
    for meta in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta in tables(db):
            found |= {v for (v,) in db.execute(f"SELECT value FROM {meta} WHERE name = 'EXPORT_HOST'")}
    return {h for h in found if h}


def referenced_strings(db: sqlite3.Connection) -> dict[int, str]:
    """StringIds entries referenced by the analysis tables (names of kernels, APIs, ranges, threads)."""
    ids: set[int] = set()
    for table in tables(db):
        if not ANALYSIS_TABLE.match(table) or table.startswith("ENUM_"):
            continue
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        cols = set(re.findall(r"^\s*(\w+)\s+\w+[^\n]*REFERENCES StringIds", sql, re.M))
        cols |= {"nameId", "textId", "demangledName", "shortName", "mangledName"} & {
            r[1] for r in db.execute(f'PRAGMA table_info("{table}")')}
        for col in cols:
            ids |= {r[0] for r in db.execute(f'SELECT DISTINCT "{col}" FROM "{table}" WHERE "{col}" IS NOT NULL')}
    return dict(db.execute(f"SELECT id, value FROM StringIds WHERE id IN ({','.join(map(str, ids)) or 'NULL'})"))


def assert_analysis_data_identical(original: Path, redacted: Path) -> None:
    a, b = connect(original), connect(redacted)
    assert tables(a) == tables(b)
    compared = [t for t in tables(a) if ANALYSIS_TABLE.match(t)]
    assert "ThreadNames" in compared and "NVTX_EVENTS" in compared
    for table in compared:
        assert rows(a, table) == rows(b, table), table
    names = referenced_strings(a)
    assert names and referenced_strings(b) == names
    gpu_cols = "vmId, id, name, busLocation, chipName, smCount, totalMemory"
    if "TARGET_INFO_GPU" in tables(a):
        assert rows(a, "TARGET_INFO_GPU") and \
            a.execute(f"SELECT {gpu_cols} FROM TARGET_INFO_GPU").fetchall() == \
            b.execute(f"SELECT {gpu_cols} FROM TARGET_INFO_GPU").fetchall()
    procs_a = a.execute("SELECT globalPid, pid, name FROM PROCESSES ORDER BY rowid").fetchall()
    procs_b = b.execute("SELECT globalPid, pid, name FROM PROCESSES ORDER BY rowid").fetchall()
    assert [(g, p, os.path.basename(n.rstrip("/")) if n and n.startswith("/") else n) for g, p, n in procs_a] == procs_b
    for meta in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta in tables(a):
            q = f"SELECT name, value FROM {meta} WHERE name LIKE 'EXPORT_PRODUCT_VERSION' OR name LIKE 'EXPORT_SCHEMA%'"
            assert a.execute(q).fetchall() == b.execute(q).fetchall() != []


# ---------------------------------------------------------------- a live 2022.4+ capture


@pytest.fixture
def live_export(nsys_path, tmp_path_factory) -> Path:
    """A fresh export of PROGRAM, run with a secret in its environment, argv, cwd and stdout."""
    if "db" in _live:
        return _live["db"]
    need("nvtx Python package", importlib.util.find_spec("nvtx") is not None)
    from nvtx_trace.capture import export, locate
    from nvtx_trace.capture import profile as profiling

    found = locate.find_nsys(nsys_path)
    work = tmp_path_factory.mktemp("redact") / f"project-{SECRET}"
    work.mkdir()
    (work / "prog.py").write_text(PROGRAM)
    result = profiling.profile(
        found, [sys.executable, "prog.py", f"--api-token={SECRET}"], work / "run",
        trace=locate.pick_traces(found, ["nvtx", "osrt"]), extra=["--sample=none", "--cpuctxsw=none"],
        env={**os.environ, "NVTX_TRACE_TEST_SECRET": SECRET}, cwd=work, capture_output=True)
    db = export.export_sqlite(found, result.require_report(), work / "run.sqlite")
    _live["db"] = db
    return db


@pytest.mark.nsys
@pytest.mark.slow
def test_live_capture_holds_the_secret_before_redaction(live_export):
    # Guards the test itself: if nsys stopped recording environments, the checks below would prove nothing.
    assert SECRET.encode() in live_export.read_bytes()
    assert environment_of(connect(live_export)).get("NVTX_TRACE_TEST_SECRET") == SECRET


@pytest.mark.nsys
@pytest.mark.slow
def test_redacted_live_capture_has_no_environment_paths_or_host(live_export, tmp_path):
    before = sha256(live_export)
    out = tmp_path / "shared.sqlite"
    summary = redact(live_export, out)
    assert sha256(live_export) == before, "the input report was modified"
    assert summary.counts["environment variables"] > 0 and summary.counts["captured program output"] > 0

    original = connect(live_export)
    env = environment_of(original)
    data = out.read_bytes()  # after VACUUM: no free pages keep the old text
    for needle in (SECRET, "PATH=", "HOME=", "NVTX_TRACE_TEST_SECRET", str(live_export.parent)):
        assert needle.encode() not in data, needle
    for key in ("HOME", "PWD", "PATH", "USER", "LOGNAME"):
        value = env.get(key, "")
        if len(value) >= 5 and value not in ("/root",):
            assert value.encode() not in data, key
    home = env.get("HOME", "")
    cells = list(text_cells(connect(out)))
    assert not [c for c in cells if SECRET in c[2] or "\x00" in c[2] and "=" in c[2]]
    if home not in ("", "/"):
        assert not [c for c in cells if home + "/" in c[2] or c[2] == home], home
    assert not [c for c in cells if re.search(r"(?<![\w.])/(home|root|tmp|Users)/", c[2])]
    for host in hostnames_of(original):
        assert not [c for c in cells if c[2] == host]
        if len(host) >= 4:
            assert host.encode() not in data
    assert_analysis_data_identical(live_export, out)


@pytest.mark.nsys
@pytest.mark.slow
def test_redaction_is_idempotent_on_a_live_capture(live_export, tmp_path):
    once, twice = tmp_path / "once.sqlite", tmp_path / "twice.sqlite"
    redact(live_export, once)
    assert redact(once, twice).total == 0
    a, b = connect(once), connect(twice)
    assert {t: rows(a, t) for t in tables(a)} == {t: rows(b, t) for t in tables(b)}


# ---------------------------------------------------------------- the shipped samples


@pytest.mark.parametrize("sample", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_samples_are_clean_and_stay_identical(sample, tmp_path):
    before = sha256(sample)
    out = tmp_path / sample.name
    summary = redact(sample, out)
    assert sha256(sample) == before
    assert summary.total == 0, summary.counts  # already redacted: nothing left to remove
    assert_analysis_data_identical(sample, out)
    a, b = connect(sample), connect(out)
    assert {t: rows(a, t) for t in tables(a)} == {t: rows(b, t) for t in tables(b)}
    data = sample.read_bytes()
    for needle in (b"PATH=", b"HOME=", b"LD_LIBRARY_PATH", b"/root/", b"/home/", b"/tmp/"):
        assert needle not in data, needle
    cells = list(text_cells(a))
    assert not [c for c in cells if "\x00" in c[2] and "=" in c[2]]
    env_rows = a.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV "
                         "WHERE name IN ('DeviceEnvironment', 'Hostname')").fetchall()
    assert env_rows and {v for (v,) in env_rows} <= {REDACTED, ""}


@pytest.mark.parametrize("sample", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_samples_analyse_the_same_after_redaction(sample, tmp_path):
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.report import json as json_report

    out = tmp_path / "again.sqlite"
    redact(sample, out)
    first = json_report.render(analyze(sample)).replace(str(sample), "REPORT")
    second = json_report.render(analyze(out)).replace(str(out), "REPORT")
    assert first == second


# ---------------------------------------------------------------- refusals and bad input


@pytest.fixture
def small_export(tmp_path) -> Path:
    """A minimal export-shaped database (the shape the checks look for), with an environment to remove."""
    path = tmp_path / "tiny.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.20.3'), ('EXPORT_HOST', 'build-box-7');
        INSERT INTO StringIds VALUES (0, 'kernel'), (1, 'SECRET_TOKEN=abc123xyz' || char(0) || 'HOME=/home/alice');
    """)
    db.commit()
    db.close()
    return path


def test_refuses_to_overwrite_without_force(small_export, tmp_path):
    out = tmp_path / "out.sqlite"
    out.write_text("keep me")
    with pytest.raises(UsageError, match="--force"):
        redact(small_export, out)
    assert out.read_text() == "keep me"
    redact(small_export, out, force=True)
    assert connect(out).execute("SELECT value FROM StringIds WHERE id = 1").fetchone()[0] == REDACTED
    assert b"abc123xyz" not in out.read_bytes() and b"alice" not in out.read_bytes()


def test_refuses_to_write_over_its_input_even_with_force(small_export, tmp_path):
    before = sha256(small_export)
    for out in (small_export, tmp_path / "." / small_export.name):
        with pytest.raises(UsageError, match="input report"):
            redact(small_export, out, force=True)
    link = tmp_path / "link.sqlite"
    os.link(small_export, link)
    with pytest.raises(UsageError, match="input report"):
        redact(small_export, link, force=True)
    assert sha256(small_export) == before


def test_missing_output_directory_is_a_usage_error(small_export, tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        redact(small_export, tmp_path / "nope" / "out.sqlite")


@pytest.mark.parametrize("kind, message", [
    ("missing", "no such file"), ("directory", "is a directory"), ("empty", "is empty"),
    ("text", "not a SQLite file"), ("other_sqlite", "not an Nsight Systems export"),
    ("truncated", "damaged"),
])
def test_bad_input_is_one_typed_error(kind, message, tmp_path, small_export):
    path = tmp_path / f"{kind}.sqlite"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("not a database\n")
    elif kind == "other_sqlite":
        sqlite3.connect(path).executescript("CREATE TABLE foo (x); INSERT INTO foo VALUES (1);")
    elif kind == "truncated":
        path.write_bytes(small_export.read_bytes()[:100] + b"\x00" * 50)
    with pytest.raises(BadReportError, match=message):
        redact(path, tmp_path / "out.sqlite")
    assert not (tmp_path / "out.sqlite").exists()
    assert not [p for p in tmp_path.iterdir() if "redact-tmp" in p.name]


def test_cli_prints_the_summary_and_where_it_wrote(small_export, tmp_path, capsys):
    out = tmp_path / "shared.sqlite"
    assert cli.main(["redact", str(small_export), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "environment variables" in captured.out and "host and user names" in captured.out
    assert f"Wrote {out}" in captured.err
    assert cli.main(["redact", str(small_export), "-o", str(out)]) == UsageError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nvtx-trace: error: ") and "--force" in err[0]
    assert cli.main(["redact", str(tmp_path / "missing.sqlite"), "-o", str(tmp_path / "x.sqlite")]) \
        == BadReportError.exit_code


def test_cli_names_the_output_after_the_input_by_default(small_export, capsys):
    assert cli.main(["redact", str(small_export)]) == 0
    assert small_export.with_name("tiny.redacted.sqlite").exists()
    assert "Wrote" in capsys.readouterr().err


def test_the_folder_and_lines_in_nvtx_autotrace_s_own_ranges_are_cut_to_basenames(tmp_path):
    """Range names stay (they are the analysis), but the settings record names the folder the program ran in and a
    sync's or copy's line may name a file outside it: both can hold the user's home. The layout sample, with its
    record's folder put back as a user's would read, and one of its names given an absolute file."""
    sample = tmp_path / "user.sqlite"
    shutil.copy(SAMPLES / "layout_sites_h200.sqlite", sample)
    db = sqlite3.connect(sample)
    db.execute("""UPDATE StringIds SET value = replace(value, '"cwd":"main"', '"cwd":"/home/alice/proj"')
                  WHERE value LIKE 'nvtx_autotrace.settings %'""")
    db.execute("""UPDATE StringIds SET value = replace(value, ' at programs/', ' at /home/alice/proj/programs/')
                  WHERE value LIKE 'sync item at %'""")
    db.commit()
    db.close()
    assert b"/home/alice/proj" in sample.read_bytes()  # the test's own premise
    out = tmp_path / "shared.sqlite"
    summary = redact(sample, out)
    assert summary.counts["absolute paths"] >= 2 and b"alice" not in out.read_bytes()
    names = [v for (v,) in connect(out).execute("SELECT value FROM StringIds")]
    assert any(v.startswith("nvtx_autotrace.settings ") and '"cwd":"proj"' in v for v in names)
    assert any(v.startswith("sync item at resnet_train.py:") for v in names)


def test_home_folders_file_urls_tilde_paths_and_spaced_folders_lose_the_user_s_name(tmp_path):
    """Issue 52, item 12: run from a home folder, the settings record's folder was cut to the user's name
    ("cwd": "jdoe4711"); a file:// URL, a ~user path and a folder name with spaces in a line of nvtx_autotrace's
    kept them whole. Each is planted in the layout sample as a user's capture would hold it."""
    sample = tmp_path / "user.sqlite"
    shutil.copy(SAMPLES / "layout_sites_h200.sqlite", sample)
    db = sqlite3.connect(sample)
    db.execute("""UPDATE StringIds SET value = replace(replace(value, '"cwd":"main"', '"cwd":"/home/jdoe4711"'),
                  ':"programs/', ':"user erin4711/my proj/') WHERE value LIKE 'nvtx_autotrace.settings %'""")
    syncs = [v for (v,) in db.execute("SELECT value FROM StringIds WHERE value LIKE 'sync item at %' ORDER BY id")]
    planted = [" at file:///home/dave4711/proj/", " at ~erin4711/scripts/"]
    for value, where in zip(syncs, planted):
        db.execute("UPDATE StringIds SET value = ? WHERE value = ?", (value.replace(" at programs/", where), value))
    db.commit()
    db.close()
    data = sample.read_bytes()
    assert len(syncs) >= 2 and b"dave4711" in data and b"erin4711/my proj" in data  # the test's own premise
    out = tmp_path / "shared.sqlite"
    redact(sample, out)
    data = out.read_bytes()
    assert b"jdoe4711" not in data and b"dave4711" not in data and b"erin4711" not in data
    names = [v for (v,) in connect(out).execute("SELECT value FROM StringIds")]
    assert any(v.startswith("nvtx_autotrace.settings ") and '"cwd":"~"' in v for v in names)
    assert sum(v.startswith(("sync item at resnet_train.py:", "sync item at file://resnet_train.py:"))
               for v in names) == 2
    assert any(v.startswith("nvtx_autotrace.settings ") and ':"resnet_train.py:' in v for v in names)


@pytest.mark.nsys
@pytest.mark.slow
def test_a_nsys_rep_is_exported_first_then_redacted(live_export, tmp_path, capsys):
    """Issue 52, item 12: a .nsys-rep was refused as "not a SQLite file"; now it is exported (beside it, as
    analyze does, the report itself unchanged) and the copy redacted."""
    rep = live_export.with_suffix(".nsys-rep")
    before = hashlib.sha256(rep.read_bytes()).hexdigest()
    out = tmp_path / "shared.sqlite"
    assert cli.main(["redact", str(rep), "-o", str(out)]) == 0
    assert SECRET.encode() not in out.read_bytes() and hashlib.sha256(rep.read_bytes()).hexdigest() == before
    assert f"Wrote {out}" in capsys.readouterr().err
