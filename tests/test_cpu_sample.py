"""The shipped CPU sample (sample_reports/cpu_slow_loader.sqlite: `nvtx-trace run` of
programs/slow_loader_train.py under Debian's nsys 2022.4, export schema 3.0.0):
every figure the analyzer reports about it is recomputed here with plain SQL."""

from __future__ import annotations

import json
import sqlite3

import pytest

from nvtx_trace.analyzer import analyze
from nvtx_trace.report import json as json_report

NAME = "cpu_slow_loader.sqlite"
PID = "(n.globalTid >> 24) & 16777215"
TEXT = "COALESCE(s.value, n.text)"


@pytest.fixture(scope="module")
def db(request):
    from conftest import SAMPLES

    path = SAMPLES / NAME
    assert path.exists(), f"missing sample report {path}; run scripts/capture_cpu_samples.sh"
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    yield path, con
    con.close()


@pytest.fixture(scope="module")
def result(db):
    return analyze(db[0])


def ranges(con, like: str) -> list[tuple[int, str, int, int]]:
    """(pid, name, start, end) of the ended NVTX ranges whose name matches ``like``, in start order."""
    return con.execute(f"SELECT {PID}, {TEXT}, n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                       f"ON s.id = n.textId WHERE {TEXT} LIKE ? AND n.end IS NOT NULL ORDER BY n.start",
                       (like,)).fetchall()


def test_sample_is_a_2022_4_export_with_ranges_in_the_training_process_and_both_workers(db, result):
    _, con = db
    assert result.nsys_version.startswith("2022.4") and result.schema_version == "3.0.0"
    pids = {pid for pid, *_ in ranges(con, "%")}
    assert len(pids) == 3, pids
    assert len({pid for pid, *_ in ranges(con, "dataloader.fetch %")}) == 2


def test_loader_waits_match_sql(db, result):
    _, con = db
    waits = ranges(con, "dataloader.next %")
    row = result.loader.loaders.iloc[0]
    assert len(result.loader.loaders) == 1 and row["loader"] == waits[0][1][len("dataloader.next ["):-1]
    assert row["waits"] == len(waits) == 13  # 12 batches and the wait that ends the epoch
    assert row["wait_ns"] == sum(e - s for _, _, s, e in waits)
    assert row["wait_ns_max"] == max(e - s for _, _, s, e in waits)


def test_worker_fetches_per_pid_match_sql(db, result):
    _, con = db
    fetches = ranges(con, "dataloader.fetch %")
    per_pid: dict[int, list[int]] = {}
    for pid, name, s, e in fetches:
        per_pid.setdefault(pid, []).append(e - s)
        assert name.endswith(f"worker {0 if pid == min(p for p, *_ in fetches) else 1}")
    got = {int(r.pid): (int(r.fetches), int(r.fetch_ns_total)) for r in result.loader.workers.itertuples()}
    assert got == {pid: (len(d), sum(d)) for pid, d in per_pid.items()}
    assert sorted(result.loader.workers["worker"]) == [0, 1]
    assert result.loader.loaders.iloc[0]["fetches"] == len(fetches)


def test_steps_and_their_durations_match_sql(db, result):
    _, con = db
    # A training step is a `step N` range with an optimizer step ending inside it; the last `step N`
    # (opened when the final optimizer step ends, running until exit) is not one.
    opt_ends = [e for _, _, _, e in ranges(con, "optimizer.step %")]
    every = ranges(con, "step %")
    steps = [r for r in every if any(r[2] <= e <= r[3] for e in opt_ends)]
    assert len(steps) == len(every) - 1
    table = result.steps.table
    assert list(table["step"]) == [int(name.split()[1]) for _, name, _, _ in steps] == list(range(len(steps)))
    assert len(steps) >= 11
    assert list(table["duration_ns"]) == [e - s for _, _, s, e in steps]
    assert list(table["start_ns"]) == [s for _, _, s, _ in steps]


def test_step_loader_wait_is_the_overlap_of_waits_with_the_step(db, result):
    _, con = db
    waits = [(s, e) for _, _, s, e in ranges(con, "dataloader.next %")]
    for r in result.steps.table.itertuples():
        overlap = sum(max(0, min(e, r.end_ns) - max(s, r.start_ns)) for s, e in waits)
        assert r.loader_wait_ns == overlap, r.step


def test_dataloader_stall_is_the_finding_and_gpu_analyses_are_skipped_with_a_reason(result):
    assert [f.kind for f in result.findings][:1] == ["dataloader_stall"]
    for name in ("gpu_idle", "layout_transpose", "pageable_h2d"):
        assert "CUDA" in result.skipped[name], result.skipped
    doc = json.loads(json_report.render(result))
    assert {"gpu_idle", "layout_transpose", "pageable_h2d"} <= set(doc["skipped"])
    assert len(doc["dataloader"]["workers"]) == 2 and all(w["fetches"] > 0 for w in doc["dataloader"]["workers"])
