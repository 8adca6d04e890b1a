"""The run history's schema is explicit and versioned: a history an earlier version made (numbers in TEXT
columns after a first run that ended before any step) reads back as numbers and is migrated when next
written; a database that is not ours is refused in one line and never written; each write is one
transaction; odd arguments to `nvtx-trace history` are one line each.

Rows come from the shipped samples' real summaries (tests/golden_questions), as in test_history.py; the commands are
real (`python -m nvtx_trace.cli history`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SAMPLES, fill
from test_history import finished
from test_hostile_outputs import one_line

from nvtx_trace.runner import history, history_store

EXPORT = SAMPLES / "cpu_slow_loader.sqlite"


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def legacy_history(path: Path) -> Path:
    """A history as nvtx-trace wrote it before its schema was explicit: sqlite-utils made each column from the
    first row, whose numbers were null (a run that ended before any step), so every number column is TEXT
    and the next run's numbers are stored as text ('5000000', '0.42', git_dirty '0')."""
    import sqlite_utils

    db = sqlite_utils.Database(sqlite3.connect(path))
    first = {"started_at": "2026-01-01T10:00:00+0000", "script": "/w/train.py", "mode": "script", "args": "[]",
             "cwd": "/w", "git_commit": None, "git_dirty": None, "torch_version": None, "cuda_version": None,
             "knobs": "{}", "window": None, "steps": None, "step_ns_median": None, "step_ns_mean": None,
             "step_modes": "null", "gpu_busy_fraction": None, "findings_count": None, "out_dir": "/w/o1",
             "exit_code": None, "duration_s": None}
    db["runs"].insert(first, pk="id")
    db["runs"].insert({**first, "started_at": "2026-01-01T11:00:00+0000", "git_commit": "abcdef12", "git_dirty": 0,
                       "steps": 12, "step_ns_median": 5_000_000, "step_ns_mean": 5_100_000, "gpu_busy_fraction": 0.42,
                       "findings_count": 1, "out_dir": "/w/o2", "exit_code": 0, "duration_s": 3.5})
    db["findings"].insert({"run_id": 2, "kind": "dataloader_stall", "cause": None, "impact_ns": None, "title": "t",
                           "predicted_step_ns": None, "recommend": "null"})
    db["findings"].insert({"run_id": 2, "kind": "sync", "cause": None, "impact_ns": 1_500_000, "title": "s",
                           "predicted_step_ns": 4_000_000, "recommend": "null"})
    db.conn.close()
    with sqlite3.connect(path) as con:  # as the issue found them: stored as text
        assert con.execute("SELECT typeof(step_ns_median), typeof(gpu_busy_fraction), typeof(git_dirty) FROM runs "
                           "WHERE id = 2").fetchone() == ("text", "text", "text")
    return path


def column_types(path: Path, table: str) -> dict:
    with sqlite3.connect(path) as con:
        return {r[1]: r[2] for r in con.execute(f"PRAGMA table_info({table})")}


def marks(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as con:
        return con.execute("PRAGMA application_id").fetchone()[0], con.execute("PRAGMA user_version").fetchone()[0]


# ================================================================ an earlier history


def test_an_earlier_history_lists_numbers_as_numbers_and_is_not_written_by_listing(tmp_path):
    db = legacy_history(tmp_path / "old.db")
    kept = sha(db)
    listed = cli("history", "--history", db, "--json")
    assert listed.returncode == 0, listed.stderr
    run = json.loads(listed.stdout)["runs"][0]
    assert (run["step_ns_median"], run["gpu_busy_fraction"], run["steps"], run["exit_code"]) == (
        5_000_000, 0.42, 12, 0)
    assert run["git_dirty"] is False  # '0' as text read back True before
    assert [f["impact_ns"] for f in run["findings"]] == [None, 1_500_000]
    shown = cli("history", "--history", db)  # crashed with ValueError on the GPU busy share stored as text
    assert shown.returncode == 0 and "GPU busy 42%" in shown.stdout and "abcdef12  " in shown.stdout, shown.stderr
    assert "+dirty" not in shown.stdout
    assert sha(db) == kept and sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]


def test_an_earlier_history_is_migrated_when_the_next_run_is_recorded(tmp_path):
    """Every later run printed `not recorded (TypeError ...)` and never its comparison line."""
    db = legacy_history(tmp_path / "old.db")
    result = finished(tmp_path / "run", "cpu_slow_loader")
    result.plan.options.target[0] = "/w/train.py"  # the same script as the stored rows
    change, warning = history.after_run(result, db, started=3_000.0)
    assert warning is None
    assert change is not None and change.startswith("since the last run of this script (2026-01-01 11:00, commit "
                                                    "abcdef12, /w/o2): step 5.10 ms -> ")  # the mean: numbers
    assert marks(db) == (history_store.APPLICATION_ID, history_store.SCHEMA_VERSION)
    types = column_types(db, "runs")
    assert types["step_ns_median"] == "INTEGER" and types["gpu_busy_fraction"] == "REAL" and \
        types["git_dirty"] == "INTEGER" and types["kind"] == "TEXT"
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT typeof(step_ns_median), typeof(gpu_busy_fraction), git_dirty FROM runs "
                           "WHERE id = 2").fetchone() == ("integer", "real", 0)
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
        assert con.execute("SELECT run_id, kind, impact_ns FROM findings ORDER BY rowid LIMIT 2").fetchall() == [
            (2, "dataloader_stall", None), (2, "sync", 1_500_000)]
    assert [r["id"] for r in history_store.query(db)] == [3, 2, 1]


def test_a_new_history_is_typed_and_marked_even_when_its_first_run_had_no_steps(tmp_path):
    db = tmp_path / "h.db"
    assert history.after_run(finished(tmp_path / "a", None, exit_code=1), db, started=1.0) == (None, None)
    assert marks(db) == (history_store.APPLICATION_ID, history_store.SCHEMA_VERSION)
    assert {c: t for c, t in column_types(db, "runs").items() if c in ("steps", "gpu_busy_fraction", "git_dirty")} \
        == {"steps": "INTEGER", "gpu_busy_fraction": "REAL", "git_dirty": "INTEGER"}
    change, warning = history.after_run(finished(tmp_path / "b", "resnet_flawed"), db, started=2.0)
    assert warning is None and "step time not comparable" in change
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT typeof(step_ns_median), typeof(gpu_busy_fraction) FROM runs WHERE id = 2"
                           ).fetchone() == ("integer", "real")


def test_words_where_numbers_belong_read_as_null_not_an_error(tmp_path):
    db = legacy_history(tmp_path / "old.db")
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET gpu_busy_fraction = 'busy', step_ns_median = 'n/a', git_dirty = 'True', "
                    "args = 'not json' WHERE id = 2")
    listed = cli("history", "--history", db, "--json")
    assert listed.returncode == 0, listed.stderr
    run = json.loads(listed.stdout)["runs"][0]
    assert (run["gpu_busy_fraction"], run["step_ns_median"], run["git_dirty"], run["args"]) == (None, None, True,
                                                                                               None)
    shown = cli("history", "--history", db)
    assert shown.returncode == 0 and "GPU busy -" in shown.stdout, shown.stderr


def test_a_history_of_a_later_version_is_read_and_written_with_its_extra_columns_kept(tmp_path):
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "cpu_slow_loader"), db, started=1.0)
    with sqlite3.connect(db) as con:
        con.execute("ALTER TABLE runs ADD COLUMN energy_j REAL")
        con.execute("UPDATE runs SET energy_j = 12.5")
        con.execute(f"PRAGMA user_version = {history_store.SCHEMA_VERSION + 1}")
    change, warning = history.after_run(finished(tmp_path / "b", "cpu_slow_loader"), db, started=2.0)
    assert warning is None and change
    assert [r.get("energy_j") for r in history_store.query(db)] == [None, 12.5]


# ================================================================ databases that are not ours


@pytest.mark.parametrize("case", ["nsys_export", "runs_table_not_ours", "another_programs_mark", "extra_tables"])
def test_a_database_that_is_not_ours_is_one_line_and_never_written(tmp_path, case):
    db = tmp_path / "x.sqlite"
    if case == "nsys_export":
        shutil.copyfile(EXPORT, db)
    else:
        with sqlite3.connect(db) as con:
            if case == "runs_table_not_ours":
                con.execute("CREATE TABLE runs (name TEXT, distance_km REAL)")
                con.execute("INSERT INTO runs VALUES ('morning', 5.2)")
            elif case == "another_programs_mark":
                con.execute("PRAGMA application_id = 1234")
                con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at TEXT, script TEXT, exit_code INT)")
            else:  # our tables beside someone else's
                con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, started_at TEXT, script TEXT, exit_code INT)")
                con.execute("CREATE TABLE invoices (n INT)")
    kept = sha(db)
    one_line(cli("history", "--history", db), "not an nvtx-trace run history", "nothing was written")
    one_line(cli("history", "--history", db, "--json"), "not an nvtx-trace run history")
    change, warning = history.after_run(finished(tmp_path / "r", "cpu_slow_loader"), db, started=1.0)
    assert change is None and "not an nvtx-trace run history" in warning and "\n" not in warning
    assert sha(db) == kept and sorted(p.name for p in tmp_path.iterdir()) == ["r", "x.sqlite"]


def test_an_empty_file_becomes_a_history(tmp_path):
    db = tmp_path / "h.db"
    db.write_bytes(b"")
    assert cli("history", "--history", db).stdout.startswith("No runs recorded")
    assert history.after_run(finished(tmp_path / "a", "cpu_slow_loader"), db, started=1.0) == (None, None)
    assert marks(db) == (history_store.APPLICATION_ID, history_store.SCHEMA_VERSION) and len(history_store.query(db)) == 1


# ================================================================ writes


def test_a_full_disk_leaves_the_history_as_it_was(tmpfs, tmp_path):
    """One transaction: the run row, its findings and any migration land together or not at all."""
    where = tmpfs("160k")
    db = legacy_history(where / "h.db")
    kept = sha(db)
    fill(where, leave=0)
    change, warning = history.after_run(finished(tmp_path / "r", "resnet_flawed"), db, started=1.0)
    assert change is None and "disk is full" in warning and "\n" not in warning
    assert sha(db) == kept and sorted(p.name for p in where.iterdir()) == ["filler", "h.db"]
    (where / "filler").unlink()
    assert history.after_run(finished(tmp_path / "r", "resnet_flawed"), db, started=1.0)[1] is None
    assert len(history_store.query(db)) == 3 and marks(db)[0] == history_store.APPLICATION_ID


def test_runs_recorded_at_once_all_land(tmp_path):
    db = tmp_path / "h.db"
    errors = []

    def one(i: int) -> None:
        _, warning = history.after_run(finished(tmp_path / f"r{i}", "cpu_slow_loader"), db, started=float(i))
        if warning:
            errors.append(warning)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    runs = history_store.query(db)
    assert sorted(r["id"] for r in runs) == list(range(1, 7))
    assert all(len(r["findings"]) == runs[0]["findings_count"] for r in runs)


def test_a_run_killed_while_writing_leaves_a_history_that_still_lists(tmp_path):
    """A writer killed mid-transaction (a scheduler's SIGKILL) leaves a hot journal, which a read-only listing
    cannot roll back ("attempt to write a readonly database"): the listing recovers it and shows the runs
    committed before."""
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "r1", "cpu_slow_loader"), db, started=1.0)
    before = history_store.query(db)
    # a tiny page cache spills the uncommitted rows into the database file; the journal keeps the old pages
    writer = ("import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
              "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN IMMEDIATE'); "
              "[c.execute('INSERT INTO findings (run_id, kind, title) VALUES (1, ?, ?)', ('x', 'y' * 2000)) "
              "for _ in range(300)]; os._exit(9)")
    subprocess.run([sys.executable, "-c", writer, str(db)], timeout=60)
    assert Path(f"{db}-journal").exists()  # hot: the file holds half a transaction
    proc = cli("history", "--history", db, "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in json.loads(proc.stdout)["runs"]] == [r["id"] for r in before]
    assert len(history_store.query(db)[0]["findings"]) == len(before[0]["findings"])  # the half transaction is gone


# ================================================================ odd arguments to `nvtx-trace history`


def test_odd_arguments_to_history_are_one_line_each(tmp_path):
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "cpu_slow_loader"), db, started=1.0)
    one_line(cli("history", "--history", db, "--last", "-1"), "--last", code=2)
    one_line(cli("history", "--history", tmp_path), "is a folder", code=2)
    one_line(cli("history", "--history", "/dev/null"), "not a regular file")
    one_line(cli("history", "--history", ""), "is a folder", code=2)  # '' is the current folder
    empty = cli("history", "--history", tmp_path / "none.db")
    assert empty.returncode == 0 and empty.stdout.startswith("No runs recorded") and not (tmp_path / "none.db").exists()


def test_history_limits_and_script_filters_mean_what_they_say(tmp_path):
    db = tmp_path / "h.db"
    for i in range(3):
        history.after_run(finished(tmp_path / f"r{i}", "cpu_slow_loader"), db, started=float(i))
    every = json.loads(cli("history", "--history", db, "--json", "--last", "0").stdout)["runs"]
    assert [r["id"] for r in every] == [3, 2, 1]  # 0: all
    huge = cli("history", "--history", db, "--json", "--last", str(10**30))  # no overflow into SQLite
    assert huge.returncode == 0 and len(json.loads(huge.stdout)["runs"]) == 3, huge.stderr
    for pattern, count in (("slow_loader", 3), ("SLOW_LOADER", 3), ("_", 3), ("%", 0), ("slow%loader", 0),
                           ("slow_loaderX", 0), ("no-such", 0)):  # LIKE's wildcards are plain characters
        listed = cli("history", "--history", db, "--json", "--script", pattern)
        if count:
            assert listed.returncode == 0 and len(json.loads(listed.stdout)["runs"]) == count, (pattern, listed.stderr)
        else:
            one_line(listed, f"no run of a script containing {pattern!r}", "slow_loader_train.py", code=1)
