"""Reports that stretch the analyzer: NULLs in nullable columns, GPU rows with invalid times,
several GPUs, a two-rank job. Each is a real H100 export (nvtx-trace run, autotrace) changed by
a few SQL statements that say what they test; expected figures come from SQL on the changed file."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from conftest import SAMPLES, edited_copy
from test_analyzer_gpu_reports import sql, sql_union_busy

from nvtx_trace.analyzer import analyze

SOURCE = SAMPLES / "resnet_flawed.sqlite"
RANK2_PID = 4242  # the second rank's pid in the two-rank build
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def changed(tmp_path, name: str, *statements: str):
    return edited_copy(SOURCE, tmp_path / f"{name}.sqlite", *statements)


@pytest.fixture(scope="module")
def base():
    return analyze(SOURCE)


def test_nulls_in_nullable_columns_keep_every_column_aligned(tmp_path, base):
    path = changed(tmp_path, "nulls",
                   f"UPDATE {KERNEL} SET globalPid = NULL WHERE rowid % 100 = 7",
                   "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET srcKind = NULL WHERE rowid % 10 = 3",
                   "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid % 50 = 3",
                   "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = NULL WHERE rowid % 50 = 3")
    got = analyze(path)
    # Kernel times are untouched, so the busy time is too (a shifted column would change it).
    assert got.idle.devices[0].busy_ns == base.idle.devices[0].busy_ns == sql_union_busy(path, 0)["busy"]
    # A copy whose source kind is unknown is neither pageable nor pinned.
    (pageable,), = sql(path, """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                               JOIN ENUM_CUDA_MEMCPY_OPER o ON o.id = m.copyKind
                               JOIN ENUM_CUDA_MEM_KIND k ON k.id = m.srcKind
                               WHERE o.name LIKE '%HTOD' AND k.name LIKE '%PAGEABLE' AND m.start > 0""")
    assert got.pageable.count == pageable < base.pageable.count


def test_gpu_rows_without_valid_times_are_left_out_and_counted(tmp_path):
    path = changed(tmp_path, "negative", f"UPDATE {KERNEL} SET start = -start, end = -end WHERE rowid % 10 = 1")
    got = analyze(path)
    (bad,), = sql(path, f"SELECT count(*) FROM {KERNEL} WHERE start <= 0")
    assert bad > 0
    assert any(w.startswith(f"{bad} kernel row(s) without a valid start/end") for w in got.warnings)
    assert got.idle.devices[0].busy_ns == sql_union_busy(path, 0)["busy"]
    lo, hi = got.window["start_ns"], got.window["end_ns"]  # the layout figures are the steady window's
    (kernel_ns,), = sql(path, f"SELECT sum(end - start) FROM {KERNEL} WHERE start > 0 AND end >= start "
                              f"AND start >= {lo} AND start < {hi}")
    assert got.layout.kernel_time_ns == kernel_ns


def test_rows_stamped_outside_the_capture_session_are_left_out(tmp_path, base):
    """int64-max and far-past stamps: without the session check the trace spanned 292 years, 100 % busy."""
    path = changed(tmp_path, "outside",
                   f"UPDATE {KERNEL} SET start = 9223372036854000000, end = 9223372036854775807 WHERE rowid % 50 = 3",
                   f"UPDATE {KERNEL} SET end = start - 5 WHERE rowid % 50 = 7")
    got = analyze(path)
    (lo, hi), = sql(path, "SELECT startTime, stopTime FROM ANALYSIS_DETAILS")
    (bad,), = sql(path, f"SELECT count(*) FROM {KERNEL} WHERE end < start OR start < {lo} - 1000000000 "
                        f"OR end > {hi} + 1000000000")
    assert bad > 0 and any(w.startswith(f"{bad} kernel row(s) without a valid start/end") for w in got.warnings)
    assert got.trace_end_ns <= hi + 1_000_000_000 and got.trace_end_ns - got.trace_start_ns < 10**11
    assert got.idle.devices[0].utilization < 0.5  # the sample is launch-bound; one bad row must not fill it
    assert [f.kind for f in got.findings][:2] == [f.kind for f in base.findings][:2]


def test_rows_on_a_device_the_report_does_not_list_are_left_out(tmp_path, base):
    """Three kernels on a "GPU 7" the report never lists: without the check, a second GPU 99 % idle."""
    path = changed(tmp_path, "unknown_device", f"UPDATE {KERNEL} SET deviceId = 7 WHERE rowid IN (11, 12, 13)")
    got = analyze(path)
    assert [d.device_id for d in got.idle.devices] == [0]
    assert any(w.startswith("3 kernel row(s) on a device the report does not list (deviceId 7)") for w in got.warnings)
    # independent: SQL over device 0's kernels, memcpys and memsets
    assert got.idle.devices[0].busy_ns == sql_union_busy(path, 0)["busy"]
    assert [f.kind for f in got.findings] == [f.kind for f in base.findings]


def test_steps_that_end_before_they_start_are_left_out_with_a_warning(tmp_path):
    path = changed(tmp_path, "backwards_steps",
                   "UPDATE NVTX_EVENTS SET end = start - 1000 WHERE textId IN "
                   "(SELECT id FROM StringIds WHERE value IN ('step 5', 'step 9'))")
    got = analyze(path)
    assert any(w.startswith("2 NVTX range(s) ending before they start") for w in got.warnings)
    table = got.steps.table
    assert (table["duration_ns"] > 0).all() and not {5, 9} & set(table["step"])
    assert got.steps.summary()["step_ns_median"] > 0


def test_a_second_rank_on_a_second_gpu(tmp_path, base):
    """Rank 2 repeats rank 1's NVTX ranges (its own worker included) and kernels on GPU 1."""
    shift = f"(({RANK2_PID} - (globalTid >> 24 & 0xFFFFFF)) << 24)"
    path = changed(
        tmp_path, "two_ranks",
        "INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS",  # the copies get their new thread ids below
        f"UPDATE NVTX_EVENTS SET globalTid = globalTid + {shift} WHERE rowid > (SELECT max(rowid) / 2 FROM NVTX_EVENTS)",
        f"CREATE TEMP TABLE k AS SELECT * FROM {KERNEL}",
        f"UPDATE temp.k SET deviceId = 1, globalPid = (globalPid & ~(0xFFFFFF << 24)) | ({RANK2_PID} << 24)",
        f"INSERT INTO {KERNEL} SELECT * FROM temp.k",
        "CREATE TEMP TABLE g AS SELECT * FROM TARGET_INFO_GPU",  # the report lists its second GPU
        "UPDATE temp.g SET id = 1",
        "INSERT INTO TARGET_INFO_GPU SELECT * FROM temp.g",
    )
    got = analyze(path)
    assert [d.device_id for d in got.idle.devices] == [0, 1]
    # Two ranks with one worker each is not a worker restart.
    assert got.loader.restarts == {} == base.loader.restarts
    assert not any("persistent_workers" in f.fix for f in got.findings)
    # Idle time is summed over both GPUs, so its share is of both GPUs' time, never over 100 %.
    stall = next(f for f in got.findings if f.kind == "dataloader_stall")
    window_ns = got.window["end_ns"] - got.window["start_ns"]
    assert f"({round(100 * stall.impact_ns / (2 * window_ns))} % of the window across 2 GPUs)" in stall.title
    # Per-step figures belong to one training process, as on the single-rank report.
    assert got.module_ranges_per_step == base.module_ranges_per_step
    assert got.steps.summary()["loader_wait_fraction"] == base.steps.summary()["loader_wait_fraction"]


def test_fractions_that_were_not_captured_are_unknown_not_zero(tmp_path):
    path = changed(tmp_path, "no_runtime", "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME")
    got = analyze(path)
    summary = got.steps.summary()
    assert summary["sync_wait_fraction"] is None and summary["gpu_busy_fraction"] > 0
    assert any("no CUDA API calls" in w for w in got.warnings)
    cpu = analyze(SAMPLES / "cpu_slow_loader.sqlite").steps.summary()
    assert cpu["gpu_busy_fraction"] is None and cpu["sync_wait_fraction"] is None
    assert cpu["loader_wait_fraction"] > 0


@pytest.mark.parametrize("name, statements", [
    ("no_kernel_table", [f"DROP TABLE {KERNEL}"]),
    ("no_kernel_names", [f"ALTER TABLE {KERNEL} DROP COLUMN {c}" for c in ("shortName", "demangledName", "mangledName")]),
    ("no_kernel_correlation", [f"ALTER TABLE {KERNEL} DROP COLUMN correlationId"]),
    ("no_runtime_correlation", ["ALTER TABLE CUPTI_ACTIVITY_KIND_RUNTIME DROP COLUMN correlationId"]),
    ("no_copy_kind", ["ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN copyKind"]),
    ("no_source_kind", ["ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY DROP COLUMN srcKind"]),
])
def test_missing_tables_and_columns_narrow_the_analysis(tmp_path, base, name, statements):
    got = analyze(changed(tmp_path, name, *statements))
    assert got.idle is not None and got.sync is not None
    assert got.sync.count == base.sync.count  # syncs need neither kernels nor correlation ids
    if name in ("no_kernel_table", "no_kernel_names"):
        assert got.layout.count == 0 and not len(got.top_kernels)
    if name in ("no_kernel_correlation", "no_runtime_correlation"):
        # transposes are still counted; with no CPU call to follow, modules come from the fallback only
        mods = got.layout.by_module
        assert got.layout.count == base.layout.count == mods["count"].sum()
        named = mods[mods["module"] != "(no enclosing range)"]
        assert len(named) and (named["via_fallback"] == named["count"]).all()
    if name in ("no_copy_kind", "no_source_kind"):
        assert got.pageable is None and "pageable_h2d" in got.skipped


def test_a_non_integer_value_is_a_bad_report_not_a_crash(tmp_path):
    from nvtx_trace.errors import BadReportError

    path = changed(tmp_path, "real", f"UPDATE {KERNEL} SET deviceId = 0.5 WHERE rowid = 10")
    with pytest.raises(BadReportError, match="non-integer values in CUPTI_ACTIVITY_KIND_KERNEL"):
        analyze(path)


def test_a_cpu_only_report_breaks_steps_down_by_the_training_thread_with_null_gpu_columns():
    """No GPU activity: the per-step breakdown is the training thread's (waits and its own CPU work), and what
    was not captured (GPU busy, copies, host syncs) is null, never 0."""
    from nvtx_trace.report import json as json_report

    a = analyze(SAMPLES / "cpu_slow_loader.sqlite")
    d = __import__("json").loads(json_report.render(a))
    rows = d["steps"]["table"]
    assert all(r["gpu_busy_ns"] is None and r["sync_wait_ns"] is None and r["loader_wait_ns"] >= 0 for r in rows)
    parts = d["step_breakdown"]
    assert [p["step"] for p in parts] == [r["step"] for r in rows]
    for p, r in zip(parts, rows):
        assert p["compute_ns"] is p["copy_ns"] is p["sync_ns"] is p["other_ns"] is None
        assert p["loader_ns"] == r["loader_wait_ns"] and p["loader_ns"] + p["cpu_ns"] == p["duration_ns"]


def test_instrumentation_cost_is_taken_out_of_cpu_bound_findings(tmp_path):
    """A real launch-bound H100 export (nvtx_autotrace ranges, captured before calibration existed) given the one
    range a calibrated process writes. The cost must equal the record's unit costs times the ranges counted here
    in SQL, and come out of the launch-bound finding, never more than it is."""
    import json

    from nvtx_trace import names

    source = SAMPLES / "resnet_fixed.sqlite"
    units = {"module_forward_ns": 1500, "module_backward_ns": 12000, "range_ns": 700, "forward_depth": 3,
             "backward_depth": 1, "method": "test record"}
    path = tmp_path / "calibrated.sqlite"
    shutil.copyfile(source, path)
    conn = sqlite3.connect(path)
    first_step = conn.execute("SELECT n.start, n.globalTid FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                              "WHERE s.value = 'step 0'").fetchone()
    conn.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                 (first_step[0] + 1, first_step[0] + 2, names.instrumentation(units), first_step[1]))
    conn.commit()
    conn.close()
    before, after = analyze(source), analyze(path)
    inst = after.instrumentation
    assert inst.settings["method"] == "test record" and inst.method == "test record"
    w0, w1 = after.window["start_ns"], after.window["end_ns"]
    pid = first_step[1] // 0x1000000 % 0x1000000
    rows = sql(path, "SELECT COALESCE(s.value, n.text) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                     f"WHERE n.eventType IN (59, 60) AND n.start >= {w0} AND n.start < {w1} "
                     f"AND n.globalTid / 0x1000000 % 0x1000000 = {pid}")
    own = [r[0] for r in rows if names.is_auto_range(r[0]) and not r[0].startswith(names.INSTRUMENTATION_PREFIX)]
    fwd = sum(1 for n in own if n.startswith(names.FORWARD_PREFIX))
    bwd = sum(1 for n in own if n.startswith(names.BACKWARD_PREFIX))
    steady = len(after.steps.steady)
    expected = (fwd * 1500 + bwd * 12000 + (len(own) - fwd - bwd) * 700) / steady
    assert fwd and bwd and inst.cost_ns_per_step == pytest.approx(expected)
    assert inst.ranges_per_step == pytest.approx(len(own) / steady)
    raw = [f for f in before.findings if "kernel launches cannot keep up" in f.title]
    cut = [f for f in after.findings if "kernel launches cannot keep up" in f.title]
    assert len(raw) == len(cut) == 1 and before.window == after.window
    taken = cut[0].evidence["instrumentation_ns"]
    assert cut[0].evidence["short_idle_ns"] == raw[0].impact_ns and cut[0].impact_ns == raw[0].impact_ns - taken
    assert 0 < taken <= inst.cost_ns_per_step * steady
    assert "the tool's own measured cost" in cut[0].title
    json.dumps(after.instrumentation.to_dict())
