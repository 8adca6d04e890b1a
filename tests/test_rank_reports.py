"""One report per rank, merged into one analysis (issue 18, item 3): the real two-rank DDP sample split
into one file per process (rank_files.py), analyzed as several files, against the analysis of the
original and against plain SQL over the files; one copy moved onto another clock, as a second host's."""

from __future__ import annotations

import importlib.util
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES, need
from rank_files import ddp_rank_groups, shift_clock, split_by_process
from test_analyzer_gpu_reports import sql, sql_union_busy

from nvtx_trace.analyzer import analyze
from nvtx_trace.analyzer import summary as summary_json
from nvtx_trace.errors import BadReportError, UsageError
from nvtx_trace.report import json as json_report

PATH = SAMPLES / "resnet_ddp_flawed.sqlite"
SHIFT_NS = 7_250_000_000  # a second host whose clock reads 7.25 s later
RANK_KEYS = {"rank", "report", "session", "clock_offset_ns", "pids", "device_ids", "steps", "step_ns_median",
             "busy_ns", "window_utilization", "compute_ns", "communication_ns", "wait_ns", "loader_wait_ns",
             "straggler"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return split_by_process(PATH, tmp_path_factory.mktemp("ranks"), ddp_rank_groups(PATH))


@pytest.fixture(scope="module")
def shifted(files, tmp_path_factory) -> list[Path]:
    other = tmp_path_factory.mktemp("host2") / "rank1.sqlite"
    shutil.copyfile(files[1], other)
    shift_clock(other, SHIFT_NS)
    return [files[0], other]


@pytest.fixture(scope="module")
def original():
    return analyze(PATH)


@pytest.fixture(scope="module")
def merged(files):
    return analyze(files)


@pytest.fixture(scope="module")
def aligned(shifted):
    return analyze(shifted)


def close(a, b, rel=0.01) -> bool:
    return a == pytest.approx(b, rel=rel)


def test_the_split_files_hold_every_gpu_and_range_row_once(files):
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
        (whole,), = sql(PATH, f"SELECT count(*) FROM {table}")
        parts = [sql(f, f"SELECT count(*) FROM {table}")[0][0] for f in files]
        assert sum(parts) == whole and min(parts) > 0
    pids = [{p for (p,) in sql(f, "SELECT DISTINCT globalPid >> 24 & 16777215 FROM CUPTI_ACTIVITY_KIND_KERNEL")}
            for f in files]
    assert pids[0].isdisjoint(pids[1])


@pytest.mark.parametrize("which", ["merged", "aligned"])
def test_merged_analysis_equals_the_original_within_one_percent(which, original, merged, aligned):
    """Busy, gaps and step medians; the busy time and gaps also against SQL over the original file."""
    a = {"merged": merged, "aligned": aligned}[which]
    assert [d.device_id for d in a.idle.devices] == [d.device_id for d in original.idle.devices] == [0, 1]
    for mine, theirs in zip(a.idle.devices, original.idle.devices):
        want = sql_union_busy(PATH, mine.device_id)
        assert close(mine.busy_ns, theirs.busy_ns) and close(mine.busy_ns, want["busy"])
        assert close(mine.gap_count, want["gap_count"]) and close(mine.gap_idle_ns, want["gap_ns"])
        assert close(mine.span_ns, want["span"])
    ours, theirs = a.steps.summary(), original.steps.summary()
    assert ours["steps"] == theirs["steps"]
    for key in ("step_ns_median", "step_ns_p90"):
        assert close(ours[key], theirs[key])
    assert close(a.window["end_ns"] - a.window["start_ns"], original.window["end_ns"] - original.window["start_ns"])


@pytest.mark.parametrize("which", ["merged", "aligned"])
def test_the_straggler_and_its_impact_survive_the_split(which, original, merged, aligned):
    a = {"merged": merged, "aligned": aligned}[which]
    mine = next(f for f in a.findings if f.kind == "straggler")
    theirs = next(f for f in original.findings if f.kind == "straggler")
    assert mine.evidence["slow_device_id"] == theirs.evidence["slow_device_id"]
    assert mine.evidence["slow_rank"] == theirs.evidence["slow_rank"]
    assert close(mine.impact_ns, theirs.impact_ns)
    assert [f.kind for f in a.findings] == [f.kind for f in original.findings]
    stragglers = [r for r in a.ranks if r["straggler"]]
    assert len(stragglers) == 1 and stragglers[0]["device_ids"] == [mine.evidence["slow_device_id"]]


def test_one_capture_session_shares_its_clock(merged):
    assert merged.clock["method"] == "shared"
    assert [r["clock_offset_ns"] for r in merged.ranks] == [0, 0]
    assert not any(w.startswith("clocks:") for w in merged.warnings)


def test_a_shifted_clock_is_found_on_the_collective_ends_and_said(aligned):
    assert aligned.clock["method"] == "collective-ends"
    moved = aligned.clock["sessions"][1]
    assert moved["offset_ns"] == pytest.approx(-SHIFT_NS, abs=50_000)  # within 50 µs of the shift
    assert moved["paired_collectives"] >= 100 and moved["residual_ns"] < 50_000
    assert [r["clock_offset_ns"] for r in aligned.ranks] == [0, moved["offset_ns"]]
    assert aligned.clock["how"].startswith("2 capture sessions") and "paired collectives" in aligned.clock["how"]
    assert not any(w.startswith("clocks:") for w in aligned.warnings)  # good to µs: said once, not a warning


def _sql_busy_in_window(path: Path, device: int, w0: int, w1: int) -> int:
    """GPU busy time inside [w0, w1): ops clipped to the window, their union by a running max of ends."""
    rows = sql(path, """
        WITH ops AS (
            SELECT max(start, ?2) AS s, min(end, ?3) AS e FROM (
                SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?1
                UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?1
                UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?1)
            WHERE end > ?2 AND start < ?3)
        SELECT s, e FROM ops ORDER BY s, e""", device, w0, w1)
    busy, reach = 0, None
    for s, e in rows:
        if reach is None or s > reach:
            busy, reach = busy + e - s, e
        elif e > reach:
            busy, reach = busy + e - reach, e
    return busy


def test_per_rank_rows_match_sql_over_each_rank_file(merged, files):
    w0, w1 = merged.window["start_ns"], merged.window["end_ns"]
    first, last = (int(merged.steps.steady["step"].iloc[i]) for i in (0, -1))
    comm = {d.device_id: d for d in merged.communication.devices}
    for row, path in zip(merged.ranks, files):
        devices = [d for (d,) in sql(path, "SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
        assert row["device_ids"] == devices and row["report"] == str(path)
        assert close(row["busy_ns"], sum(_sql_busy_in_window(path, d, w0, w1) for d in devices))
        steps = sql(path, """SELECT n.end - n.start, CAST(substr(s.value, 6) AS INTEGER) FROM NVTX_EVENTS n
                             JOIN StringIds s ON s.id = n.textId WHERE s.value GLOB 'step [0-9]*'""")
        want = statistics.median(d for d, n in steps if first <= n <= last)
        assert row["steps"] == last - first + 1 and close(row["step_ns_median"], want)
        assert row["wait_ns"] == sum(comm[d].wait_ns for d in devices)
        assert set(row) == RANK_KEYS


def test_json_has_clock_and_ranks_only_for_several_reports(merged, original):
    several, one = summary_json.to_dict(merged), summary_json.to_dict(original)
    assert "ranks" not in one and "clock" not in one
    assert [r["rank"] for r in several["ranks"]] == [0, 1]
    assert set(several["clock"]) == {"method", "how", "sessions"}
    assert list(several)[3:5] == ["clock", "ranks"]
    assert json_report.render(merged)  # serializable as it stands


def test_a_folder_or_an_unexpanded_glob_names_the_same_reports(files, merged):
    for arg in (files[0].parent, str(files[0].parent / "rank*.sqlite")):
        a = analyze(arg, workers=1)
        assert [r["report"] for r in a.ranks] == [str(f) for f in files]
        assert [d.busy_ns for d in a.idle.devices] == [d.busy_ns for d in merged.idle.devices]


def test_reading_in_a_process_pool_gives_what_reading_one_by_one_gives(files):
    serial, pool = analyze(files, workers=1), analyze(files, workers=2)
    assert summary_json.to_dict(serial) == summary_json.to_dict(pool)


@pytest.mark.slow
def test_a_local_dask_cluster_gives_the_same_analysis(files, merged):
    need("dask.distributed", importlib.util.find_spec("distributed") is not None)
    a = analyze(files, scheduler="local:2")
    assert summary_json.to_dict(a) == summary_json.to_dict(merged)
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:  # by its address
        b = analyze(files, scheduler=cluster.scheduler_address)
    assert summary_json.to_dict(b) == summary_json.to_dict(merged)


def _copy(src: Path, dst: Path, sql_text: str | None = None) -> Path:
    shutil.copyfile(src, dst)
    if sql_text:
        conn = sqlite3.connect(dst)
        conn.execute(sql_text)
        conn.commit()
        conn.close()
    return dst


def test_mixed_up_inputs_are_one_clear_error(files, tmp_path):
    again = _copy(files[0], tmp_path / "again.sqlite")
    with pytest.raises(BadReportError, match="same process"):
        analyze([files[0], again])
    later = _copy(files[1], tmp_path / "other_run.sqlite",
                  "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + 86400000000000")
    with pytest.raises(BadReportError, match="did not overlap in time"):
        analyze([files[0], later])
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadReportError, match="is a directory with no reports"):
        analyze(tmp_path / "empty")
    with pytest.raises(BadReportError, match="no report matches"):
        analyze(str(tmp_path / "nothing*.sqlite"))
    text = tmp_path / "notes.sqlite"
    text.write_text("not a report\n")
    with pytest.raises(BadReportError, match="not a SQLite file"):
        analyze([files[0], text], workers=2)
    with pytest.raises(UsageError, match="local:N"):
        analyze(files, scheduler="local:x")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_cli_several_reports_print_the_rank_table_and_bad_ones_one_line(files, tmp_path):
    ok = _cli(*files)
    assert ok.returncode == 0, ok.stderr
    assert "2 reports merged" in ok.stdout and "Ranks" in ok.stdout and "straggler" in ok.stdout
    (tmp_path / "empty").mkdir()
    text = tmp_path / "notes.sqlite"
    text.write_text("not a report\n")
    for args, needle in (((tmp_path / "empty",), "is a directory with no reports"), ((files[0], text), "not a SQLite file"),
                         ((files[0], files[0].parent / "missing.sqlite"), "missing.sqlite")):
        bad = _cli(*args)
        lines = [line for line in bad.stderr.splitlines() if line.strip()]
        assert bad.returncode != 0 and "Traceback" not in bad.stderr + bad.stdout
        assert len(lines) == 1 and lines[0].startswith("nvtx-trace: error: ") and needle in lines[0], bad.stderr


def test_another_hosts_pid_and_gpu_id_stay_distinct(files, tmp_path):
    """The same rank captured on a second host (same pid, same GPU 0, its own clock): two GPUs, two
    processes, each with the figures of the one it came from."""
    twin = _copy(files[0], tmp_path / "host2_rank0.sqlite")
    shift_clock(twin, SHIFT_NS)
    a = analyze([files[0], twin], workers=1)
    assert [d.device_id for d in a.idle.devices] == [0, 1]
    (want,) = [sql_union_busy(files[0], 0)["busy"]]
    assert [d.busy_ns for d in a.idle.devices] == [want, want]
    first, second = a.ranks
    assert second["device_ids"] == [1] and set(first["pids"]).isdisjoint(second["pids"])
    assert a.clock["sessions"][1]["offset_ns"] == -SHIFT_NS and a.clock["sessions"][1]["residual_ns"] == 0
    assert any("renumbered" in w and "host2_rank0.sqlite's GPU 0 is shown as GPU 1" in w for w in a.warnings)


def test_a_moved_gpu_never_lands_on_an_id_its_own_report_uses(files, tmp_path):
    """Host 1: rank 0 (GPU 0); host 2: both ranks in one report (GPUs 0 and 1). Host 2's GPU 0 must not be
    renumbered onto its own GPU 1 (review): three GPUs, each with the busy time SQL gives its source."""
    node = _copy(PATH, tmp_path / "host2_node.sqlite")
    shift_clock(node, SHIFT_NS)
    a = analyze([files[0], node], workers=1)
    busy = {d.device_id: d.busy_ns for d in a.idle.devices}
    assert busy == {0: sql_union_busy(files[0], 0)["busy"], 1: sql_union_busy(PATH, 1)["busy"],
                    2: sql_union_busy(PATH, 0)["busy"]}
    assert [sorted(r["device_ids"]) for r in a.ranks] == [[0], [1, 2]]
    assert any("host2_node.sqlite's GPU 0 is shown as GPU 2" in w for w in a.warnings)


def test_one_hosts_ids_keep_one_merged_id_across_its_reports_and_never_share_one():
    """Host B's GPUs 0 and 1 move (host A has them); B's own GPU 2, in a later report, must not land on the id
    B's GPU 0 was moved to, and B's GPU 0 seen again keeps its moved id (review)."""
    from nvtx_trace.analyzer.ranks.merge import _Ids

    ids = _Ids()
    assert ids.plan({0}, "A", "a0", "GPU") == {0: 0} and ids.plan({1}, "A", "a1", "GPU") == {1: 1}
    assert ids.plan({0, 1}, "B", "b01", "GPU") == {0: 2, 1: 3}
    assert ids.plan({2}, "B", "b2", "GPU") == {2: 4} and ids.plan({0}, "B", "b0", "GPU") == {0: 2}
    assert ids.plan({0}, "A", "a0again", "GPU") == {0: 0}


def test_a_capture_missing_its_first_collectives_is_still_aligned(shifted, tmp_path):
    """The second host's capture began three collectives late: pairing by order alone would be off by
    three; the best-fitting pairing leaves them out and finds the same offset."""
    late = _copy(shifted[1], tmp_path / "late.sqlite")
    conn = sqlite3.connect(late)
    conn.execute("""DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN (
                        SELECT k.rowid FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                        WHERE s.value LIKE 'nccl%' ORDER BY k.start LIMIT 3)""")
    conn.commit()
    conn.close()
    a = analyze([shifted[0], late], workers=1)
    moved = a.clock["sessions"][1]
    assert moved["method"] == "collective-ends" and moved["offset_ns"] == pytest.approx(-SHIFT_NS, abs=50_000)
    assert any("the first 3 of rank0.sqlite left unpaired" in w for w in a.warnings)


def test_a_folder_lists_its_reports_in_rank_order_each_once(tmp_path):
    from nvtx_trace.analyzer.ranks.inputs import expand

    for name in ("rank10.sqlite", "rank2.sqlite", "rank2.nsys-rep", "rank3.nsys-rep", "summary.json", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    want = [tmp_path / n for n in ("rank2.sqlite", "rank3.nsys-rep", "rank10.sqlite")]
    assert expand(tmp_path) == want  # an export beside its .nsys-rep counts once, as the export
    assert expand([str(tmp_path / "rank*"), tmp_path / "rank2.sqlite"]) == want
