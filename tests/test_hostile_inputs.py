"""Hostile and unlucky input (issue 33): corrupt exports, meaningless option values, and `diff`/`history` misuse.

Each export here is a real shipped sample (sample_reports/, unpacked by conftest) copied and changed by the few
SQL statements a case names. Where the analysis can go on, what it could not use is inferred safely or counted
in a warning that reaches the text output and the JSON, and its figures are checked against SQL on the
unmodified report; where it cannot, the user gets one line on stderr, a non-zero exit and no traceback. No
input is ever changed (SHA-256 before and after)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SAMPLES, edited_copy
from test_analyzer_gpu_reports import sql, sql_union_busy
from test_bad_input import assert_one_clear_line, digest, run_cli_here

from nvtx_trace.analyzer import analyze

SINGLE = SAMPLES / "resnet_flawed.sqlite"  # one H100
DDP = SAMPLES / "resnet_ddp_flawed.sqlite"  # two H200s, one process each
USER = SAMPLES / "resnet_flawed_user.sqlite"  # `step N` ranges of the user's own
KERNEL, MEMCPY, RUNTIME = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_RUNTIME"


def loosen(table: str) -> list[str]:
    """Rebuild ``table`` without its NOT NULL constraints (as other exporters write it), rows unchanged."""
    return [f"CREATE TABLE loose AS SELECT * FROM {table}", f"DROP TABLE {table}", f"ALTER TABLE loose RENAME TO {table}"]


def changed(tmp_path: Path, source: Path, *statements: str, name: str = "changed.sqlite") -> Path:
    return edited_copy(source, tmp_path / name, *statements)


def analyzed_by_cli(path: Path, tmp_path: Path, *options) -> tuple[dict, str]:
    """`nvtx-trace analyze PATH --json FILE`: (its JSON, its text output); exit 0, no traceback, input untouched."""
    before = digest(path)
    out = tmp_path / "summary.json"
    proc = run_cli_here("analyze", path, "--json", out, "--force", *options)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert digest(path) == before
    return json.loads(out.read_text()), " ".join(proc.stdout.split())


def warned(summary: dict, text: str, start: str) -> str:
    """The one warning beginning with ``start``, found both in the JSON and in the terminal text."""
    hits = [w for w in summary["warnings"] if w.startswith(start)]
    assert len(hits) == 1, summary["warnings"]
    assert " ".join(hits[0].split()) in text
    return hits[0]


def decoded(path: Path):
    """The decoded tables of an export (analyzer/trace/tables.py's Trace), for row counts against SQL."""
    from nvtx_trace.analyzer.trace.reader import Reader
    from nvtx_trace.analyzer.trace.tables import Trace

    return Trace(Reader(path))


def finding(a, kind: str):
    return next((f for f in a.findings if f.kind == kind), None)


@pytest.fixture(scope="module")
def single():
    return analyze(SINGLE)


@pytest.fixture(scope="module")
def ddp():
    return analyze(DDP)


# ---------------------------------------------------------------- corrupt exports


def test_a_kernel_table_without_device_ids_runs_on_the_one_gpu_listed(tmp_path, single):
    """Before: every kernel on a phantom "GPU -1", the loader stall doubled "across 2 GPUs", a gpu_idle invented."""
    path = changed(tmp_path, SINGLE, f"ALTER TABLE {KERNEL} DROP COLUMN deviceId")
    summary, text = analyzed_by_cli(path, tmp_path)
    assert [d["device_id"] for d in summary["devices"]] == [0]
    warned(summary, text, "the kernel table has no deviceId column: each row's GPU was taken from the one GPU")
    got = analyze(path)
    assert got.idle.devices[0].busy_ns == sql_union_busy(SINGLE, 0)["busy"] == single.idle.devices[0].busy_ns
    stall, base_stall = finding(got, "dataloader_stall"), finding(single, "dataloader_stall")
    assert stall.impact_ns == base_stall.impact_ns and stall.title == base_stall.title and "GPUs" not in stall.title
    assert [f.kind for f in got.findings] == [f.kind for f in single.findings]
    assert "GPU -1" not in text


@pytest.mark.parametrize("via", ["context", "stream"])
def test_without_device_ids_each_gpu_is_found_from_its_cuda_context(tmp_path, ddp, via):
    """Both processes' contexts are context 1: only (process, context) -- or (process, stream) where the table has
    no context column either -- names the GPU, from the context table."""
    drop = ["deviceId"] + (["contextId"] if via == "stream" else [])
    path = changed(tmp_path, DDP, *(f"ALTER TABLE {KERNEL} DROP COLUMN {c}" for c in drop))
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, "the kernel table has no deviceId column: each row's GPU was taken from each row's CUDA "
                          + {"context": "context (TARGET_INFO_CUDA_CONTEXT_INFO)",
                             "stream": "stream (TARGET_INFO_CUDA_STREAM, TARGET_INFO_CUDA_CONTEXT_INFO)"}[via])
    got = analyze(path)
    assert [d.device_id for d in got.idle.devices] == [0, 1]
    for dev in got.idle.devices:
        assert dev.busy_ns == sql_union_busy(DDP, dev.device_id)["busy"]
    assert [(f.kind, f.impact_ns) for f in got.findings] == [(f.kind, f.impact_ns) for f in ddp.findings]


def test_without_device_ids_or_contexts_two_gpus_are_one_unknown_gpu_not_three(tmp_path):
    path = changed(tmp_path, DDP, f"ALTER TABLE {KERNEL} DROP COLUMN deviceId",
                   "DROP TABLE TARGET_INFO_CUDA_CONTEXT_INFO")
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, "the kernel table has no deviceId column and the report does not say which GPU ran each "
                          "row (it lists 2 GPUs): all GPU activity is analyzed as one GPU, GPU 0")
    assert [d["device_id"] for d in summary["devices"]] == [0]
    (busy,), = sql(DDP, f"""WITH ops AS (SELECT start, end FROM {KERNEL} UNION ALL SELECT start, end FROM {MEMCPY}
                                         UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET),
                            o AS (SELECT start, end, MAX(end) OVER (ORDER BY start, end ROWS BETWEEN UNBOUNDED
                                  PRECEDING AND 1 PRECEDING) AS reach FROM ops)
                            SELECT MAX(end) - MIN(start) - SUM(CASE WHEN start > reach THEN start - reach ELSE 0 END)
                            FROM o""")
    assert summary["devices"][0]["busy_ns"] == busy  # the union of both GPUs' work: nothing doubled
    stall = next(f for f in summary["findings"] if f["kind"] == "dataloader_stall")
    assert "across" not in stall["title"] and "GPU -1" not in text


def test_null_device_ids_are_filled_from_the_context_table(tmp_path, ddp):
    path = changed(tmp_path, DDP, *loosen(MEMCPY), f"UPDATE {MEMCPY} SET deviceId = NULL WHERE rowid % 3 = 0")
    got = analyze(path)
    assert [d.device_id for d in got.idle.devices] == [0, 1]
    assert [d.busy_ns for d in got.idle.devices] == [sql_union_busy(DDP, d)["busy"] for d in (0, 1)]
    (nulls,), = sqlite3.connect(path).execute(f"SELECT COUNT(*) FROM {MEMCPY} WHERE deviceId IS NULL").fetchall()
    said = [w for w in got.warnings if w not in ddp.warnings]  # the README's promise: filled in, and said
    assert said == [f"{nulls} memcpy row(s) had no deviceId: each one's GPU was taken from each row's CUDA "
                    "context (TARGET_INFO_CUDA_CONTEXT_INFO)"] and got.pageable.count == ddp.pageable.count


@pytest.mark.parametrize("case", ["null", "blob"])
def test_string_table_values_that_are_null_or_binary_are_read_and_counted(tmp_path, single, case):
    """Before: a TypeError traceback from a regular expression given None or bytes."""
    edit = {"null": "UPDATE StringIds SET value = NULL WHERE id % 7 = 3",
            "blob": "UPDATE StringIds SET value = CAST(value AS BLOB) WHERE id % 5 = 1"}[case]
    path = changed(tmp_path, SINGLE, *loosen("StringIds"), edit,
                   "UPDATE StringIds SET value = X'ff00fe41' WHERE id = (SELECT max(id) FROM StringIds)")
    (nulls,), = sql(path, "SELECT count(*) FROM StringIds WHERE value IS NULL")
    (blobs,), = sql(path, "SELECT count(*) FROM StringIds WHERE typeof(value) = 'blob'")
    summary, text = analyzed_by_cli(path, tmp_path)
    line = warned(summary, text, "names in the string table that are not text:")
    assert (f"{nulls} NULL" in line) == bool(nulls) and f"{blobs} binary" in line
    if case == "blob":  # valid UTF-8 in a BLOB is the same text: the same analysis
        got = analyze(path)
        assert [(f.kind, f.impact_ns) for f in got.findings] == [(f.kind, f.impact_ns) for f in single.findings]
        assert got.steps.summary() == single.steps.summary()


def test_numbers_in_the_string_table_are_read_as_text(tmp_path):
    path = changed(tmp_path, SINGLE, "UPDATE StringIds SET value = 12345 WHERE id % 13 = 4")
    summary, _ = analyzed_by_cli(path, tmp_path)
    assert not any("string table" in w for w in summary["warnings"])


def test_gpu_rows_with_null_times_are_counted_and_left_out(tmp_path, single):
    path = changed(tmp_path, SINGLE, *loosen(KERNEL), f"UPDATE {KERNEL} SET start = NULL WHERE rowid % 50 = 1",
                   f"UPDATE {KERNEL} SET end = NULL WHERE rowid % 50 = 2")
    (bad,), = sql(path, f"SELECT count(*) FROM {KERNEL} WHERE start IS NULL OR end IS NULL")
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, f"{bad} kernel row(s) without a valid start/end")
    without = changed(tmp_path, SINGLE, f"DELETE FROM {KERNEL} WHERE rowid % 50 IN (1, 2)", name="without.sqlite")
    assert analyze(path).idle.devices[0].busy_ns == sql_union_busy(without, 0)["busy"] < single.idle.devices[0].busy_ns


def test_cuda_calls_without_times_or_thread_are_counted_and_left_out(tmp_path, single):
    path = changed(tmp_path, SINGLE, *loosen(RUNTIME), f"UPDATE {RUNTIME} SET start = NULL WHERE rowid % 40 = 1",
                   f"UPDATE {RUNTIME} SET end = NULL WHERE rowid % 40 = 2",
                   f"UPDATE {RUNTIME} SET end = start - 10 WHERE rowid % 40 = 3",
                   f"UPDATE {RUNTIME} SET globalTid = NULL WHERE rowid % 40 = 4")
    (bad,), = sql(path, f"SELECT count(*) FROM {RUNTIME} WHERE start IS NULL OR end IS NULL OR end < start "
                        "OR globalTid IS NULL")
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, f"{bad} CUDA API call(s) without a valid start/end or a thread")
    assert summary["devices"] == analyzed_by_cli(SINGLE, tmp_path)[0]["devices"]
    (slow,), = sql(path, f"SELECT count(*) FROM {RUNTIME} WHERE end - start >= 50000 AND globalTid IS NOT NULL")
    calls = decoded(path).api_calls(min_duration_ns=50_000)
    assert len(calls) == slow and (calls["gtid"] > 0).all()  # no call of a phantom thread


def test_nvtx_ranges_without_start_or_thread_are_counted_and_left_out(tmp_path, single):
    path = changed(tmp_path, SINGLE, *loosen("NVTX_EVENTS"),
                   "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid % 60 = 1",
                   "UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid % 60 = 2")
    (bad,), = sql(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71) "
                        "AND (start IS NULL OR globalTid IS NULL)")
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, f"{bad} NVTX range(s) without a start time or a thread (NULL in the export) were left out")
    (kept,), = sql(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71) AND start > 0 "
                         "AND globalTid IS NOT NULL")
    ranges = decoded(path).ranges
    assert len(ranges) == kept and (ranges["gtid"] > 0).all()


def test_nvtx_texts_stored_as_blobs_are_the_same_ranges(tmp_path, single):
    path = changed(tmp_path, SINGLE, "UPDATE NVTX_EVENTS SET text = CAST(text AS BLOB) WHERE text IS NOT NULL",
                   "UPDATE NVTX_EVENTS SET text = X'80ff41', textId = NULL WHERE rowid = 5")
    got = analyze(path)
    assert got.steps.summary() == single.steps.summary() and got.loader.waits.equals(single.loader.waits)


def test_null_ids_and_binary_names_in_the_side_tables(tmp_path, single):
    path = changed(tmp_path, SINGLE, *loosen("ThreadNames"), *loosen("PROCESSES"), *loosen("TARGET_INFO_GPU"),
                   "UPDATE ThreadNames SET nameId = NULL", "UPDATE PROCESSES SET globalPid = NULL WHERE rowid = 1",
                   "INSERT INTO ThreadNames (globalTid, nameId, priority) VALUES (NULL, 5, 1)",
                   "UPDATE TARGET_INFO_GPU SET name = CAST(name AS BLOB)",
                   "INSERT INTO TARGET_INFO_GPU (vmId, id, name) VALUES (0, NULL, 'ghost')")
    summary, _ = analyzed_by_cli(path, tmp_path)
    assert [(d["device_id"], d["name"]) for d in summary["devices"]] == [(0, "NVIDIA H100 80GB HBM3")]
    assert [f["kind"] for f in summary["findings"]] == [f.kind for f in single.findings]


def test_an_export_whose_kernels_all_lack_a_start_is_analyzed_from_the_rest(tmp_path):
    path = changed(tmp_path, SINGLE, *loosen(KERNEL), f"UPDATE {KERNEL} SET start = NULL")
    (kernels,), = sql(path, f"SELECT count(*) FROM {KERNEL}")
    summary, text = analyzed_by_cli(path, tmp_path)
    warned(summary, text, f"{kernels} kernel row(s) without a valid start/end")
    assert summary["steps"]["summary"]["steps"] == 30


def test_a_garbage_wal_file_beside_an_export_is_ignored_and_left_alone(tmp_path, single):
    folder = tmp_path / "r"
    folder.mkdir()
    shutil.copyfile(SINGLE, folder / "report.sqlite")
    (folder / "report.sqlite-wal").write_bytes(os.urandom(5000))
    before = {p.name: digest(p) for p in folder.iterdir()}
    summary, _ = analyzed_by_cli(folder / "report.sqlite", tmp_path)
    assert [f["kind"] for f in summary["findings"]] == [f.kind for f in single.findings]
    assert {p.name: digest(p) for p in folder.iterdir()} == before


def _unreadable(tmp):
    if os.geteuid() == 0:
        pytest.skip("root reads any file: permissions cannot refuse it here")
    p = tmp / "locked.sqlite"
    shutil.copyfile(USER, p)
    p.chmod(0)
    return p


CORRUPT = {  # name: (make the input in tmp, words the one line must hold)
    "first_10_kb_of_an_export": (lambda t: _bytes(t, "cut.sqlite", USER.read_bytes()[:10240]), "export it again"),
    "sqlite_header_only": (lambda t: _bytes(t, "head.sqlite", USER.read_bytes()[:100]), "damaged"),
    "zero_bytes": (lambda t: _bytes(t, "zero.sqlite", b""), "is empty"),
    "text_file_named_sqlite": (lambda t: _bytes(t, "notes.sqlite", b"step 1 took 80 ms\n" * 50), "not a SQLite file"),
    "garbage_nsys_rep": (lambda t: _bytes(t, "r.nsys-rep", os.urandom(5000)), "nsys"),
    "garbage_xz": (lambda t: _bytes(t, "r.sqlite.xz", b"not xz at all"), "cannot be decompressed"),
    "folder_without_reports": (lambda t: _folder(t), "no reports in it"),
    "no_read_permission": (_unreadable, "cannot be read"),
}


def _bytes(tmp, name, data):
    p = tmp / name
    p.write_bytes(data)
    return p


def _folder(tmp):
    p = tmp / "reports"
    p.mkdir()
    (p / "notes.txt").write_text("not a report")
    return p


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_an_export_that_cannot_be_read_is_one_line(tmp_path, case):
    make, words = CORRUPT[case]
    path = make(tmp_path)
    if case == "garbage_nsys_rep":
        from conftest import installed_nsys

        installed_nsys()
    before = {p: digest(p) for p in tmp_path.rglob("*")}
    assert_one_clear_line(run_cli_here("analyze", path), words, str(path))
    assert {p: digest(p) for p in tmp_path.rglob("*")} == before  # nothing changed, nothing left beside it


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("option, value, words", [
    ("--step-range", "", "matches the empty text"),
    ("--step-range", ".*", "matches the empty text"),
    ("--loader-pattern", "", "matches the empty text"),
    ("--step-range", "^train_step$", "matches no NVTX range"),
    ("--html-max-points", "0", "--html-max-points must be at least 100"),
    ("--html-max-points", "-1", "--html-max-points must be at least 100"),
    ("--workers", "0", "--workers must be at least 1"),
    ("--warmup-steps", "30", "--warmup-steps 30 leaves no steady step"),
])
def test_option_values_that_mean_nothing_are_one_line(option, value, words):
    before = digest(USER)
    proc = run_cli_here("analyze", USER, option, value)
    assert_one_clear_line(proc, words)
    assert proc.returncode == 2 and digest(USER) == before


def test_a_step_range_that_matches_nothing_names_the_ranges_there_are():
    line = run_cli_here("analyze", USER, "--step-range", "train_step").stderr.strip()
    (n,), = sql(USER, "SELECT count(*) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                      "WHERE s.value GLOB 'step [0-9]*'")
    assert f"'step N' x{n}" in line and "'forward' x30" in line


@pytest.mark.parametrize("pattern", [".", "step|optimizer", "^step|^forward"])
def test_ranges_nested_inside_matching_ones_are_not_steps(pattern):
    """`.` also matches every range inside each step: before, 151 "steps" of 8.4 ms instead of 30 of 88.8 ms."""
    import re

    default = analyze(USER).steps
    got = analyze(USER, step_range=pattern).steps
    names = [n for (n,) in sql(USER, "SELECT s.value FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                                     "WHERE n.eventType IN (59, 60) AND s.value NOT GLOB 'step [0-9]*' AND n.globalTid = "
                                     "(SELECT globalTid FROM NVTX_EVENTS WHERE textId = (SELECT id FROM StringIds "
                                     "WHERE value = 'step 0'))")]
    nested = sum(1 for n in names if re.search(pattern, n))  # the steps' thread's other ranges all lie in a step
    assert len(got.table) == len(default.table) == 30
    assert (got.table["start_ns"].to_numpy() == default.table["start_ns"].to_numpy()).all()
    assert got.summary()["step_ns_median"] == default.summary()["step_ns_median"]
    assert f"; {nested} matching range(s) nested inside them left out" in got.how


def test_run_refuses_an_empty_step_range_before_profiling(tmp_path):
    out = tmp_path / "out"
    script = tmp_path / "t.py"
    script.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    assert_one_clear_line(run_cli_here("run", "--out", out, "--step-range", "", script), "--step-range")
    assert not out.exists() and not (tmp_path / "ran").exists()


def _startup_seconds() -> float:
    """How long this interpreter takes to start bare here (site-packages' .pth files included)."""
    times = []
    for _ in range(3):
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.monotonic() - t)
    return max(times)  # the slowest: a signal inside the interpreter's own start-up is beyond our code


@pytest.mark.parametrize("after", [0.1, 0.2, 0.3])
def test_ctrl_c_while_the_command_line_starts_is_exit_130_without_a_traceback(after):
    """Before: a KeyboardInterrupt traceback from inside typer's or rich's imports. A signal that lands while the
    interpreter itself still starts (killed by it, no Python handler yet: beyond our code, on a loaded machine)
    is sent again later, up to three times."""
    delay = _startup_seconds() + after  # measured before the command starts, so the signal lands where meant
    for _attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(USER)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        if not (proc.returncode == -signal.SIGINT and not err.strip()):
            break
        delay += 0.2
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert lines in ([], ["nvtx-trace: interrupted"], ["nvtx-trace: interrupted (SIGINT)"]), err


# ---------------------------------------------------------------- diff and history misuse


@pytest.fixture(scope="module")
def good_summary(tmp_path_factory) -> dict:
    proc = run_cli_here("analyze", USER, "--json", "-")
    assert proc.returncode == 0
    return json.loads(proc.stdout)


def _edited(summary: dict, edit) -> dict:
    data = json.loads(json.dumps(summary))
    edit(data)
    return data


DIFF_SUMMARIES = {  # name: (edit of a real summary.json, or its whole text; words the one line must hold)
    "number_is_a_string": (lambda d: d["steps"]["summary"].update(step_ns_median="fast"),
                           "steps.summary.step_ns_median should be a positive number"),
    "dict_is_a_list": (lambda d: d["steps"].update(summary=[1, 2]), "steps.summary should be an object"),
    "findings_is_a_dict": (lambda d: d.update(findings={"kind": "sync"}), "findings should be a list"),
    "finding_without_impact": (lambda d: d["findings"][0].pop("impact_ns"), "findings[0].impact_ns should be"),
    "finding_without_kind": (lambda d: d["findings"][0].pop("kind"), "findings[0].kind should be a text"),
    "finding_is_a_string": (lambda d: d["findings"].insert(0, "sync"), "findings[0] should be an object"),
    "prediction_is_a_string": (lambda d: d["findings"][0].update(predicted="soon"),
                               "findings[0].predicted should be an object"),
    "busy_share_above_one": (lambda d: d["steps"]["summary"].update(gpu_busy_fraction=3.5),
                             "gpu_busy_fraction should be a number from 0 to 1"),
    "step_is_zero": (lambda d: d["steps"]["summary"].update(step_ns_median=0), "step_ns_median should be a positive"),
    "step_beyond_int64": (lambda d: d["steps"]["summary"].update(step_ns_mean=10 ** 400),
                          "steps.summary.step_ns_mean should be"),
    "report_is_a_string": (lambda d: d.update(report="run.sqlite"), "report should be an object"),
    "try_step_is_a_list": (lambda d: d.update(**{"try": {"predicted_step_ms": [1], "measured_step_ms": 2}}),
                           "try.predicted_step_ms should be"),
    "nan": ('{"findings": [], "steps": {"summary": {"step_ns_median": NaN}}}', "should be a positive number"),
    "not_json": ("{findings: [", "not a readable summary.json"),
    "empty_file": ("", "not a readable summary.json"),
    "json_array": ("[1, 2]", "a JSON list, not an object"),
    "nested_too_deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(DIFF_SUMMARIES))
def test_diff_of_a_damaged_summary_names_the_file_and_the_field(tmp_path, good_summary, case):
    """Before: TypeError, KeyError, AttributeError, OverflowError or RecursionError tracebacks."""
    edit, words = DIFF_SUMMARIES[case]
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(good_summary))
    bad.write_text(edit if isinstance(edit, str) else json.dumps(_edited(good_summary, edit)))
    before = {p: digest(p) for p in (good, bad)}
    assert_one_clear_line(run_cli_here("diff", good, bad), str(bad), words)
    assert_one_clear_line(run_cli_here("diff", bad, good), str(bad), words)
    assert {p: digest(p) for p in (good, bad)} == before


@pytest.mark.parametrize("case", ["same_file", "same_folder", "folder_and_its_summary", "its_report_and_summary"])
def test_diff_of_a_run_with_itself_is_refused(tmp_path, good_summary, case):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(good_summary))
    shutil.copyfile(USER, run / "report.sqlite")
    before, after = {"same_file": (run / "summary.json", run / "summary.json"), "same_folder": (run, tmp_path / "."
                     / "run"), "folder_and_its_summary": (run, run / "summary.json"),
                     "its_report_and_summary": (run / "report.sqlite", run / "summary.json")}[case]
    assert_one_clear_line(run_cli_here("diff", before, after), "are the same run", "give the run before the change")


def test_diff_of_a_report_against_another_runs_summary_analyzes_the_report(tmp_path, good_summary):
    """Mixed sides are documented: a report is analyzed now with the default options, a summary.json read."""
    other = tmp_path / "summary.json"
    other.write_text(json.dumps(good_summary))
    proc = run_cli_here("diff", SINGLE, other, "--json", "-")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["before"]["report"] == str(SINGLE) and d["after"]["report"] == str(USER)


@pytest.fixture(scope="module")
def history_db(tmp_path_factory) -> Path:
    from test_history import finished

    from nvtx_trace.runner import history

    folder = tmp_path_factory.mktemp("history")
    db = folder / "h.db"
    history.after_run(finished(folder / "a", "cpu_slow_loader"), db, started=1_000.0)
    history.after_run(finished(folder / "b", "cpu_slow_loader"), db, started=2_000.0)
    return db


@pytest.mark.parametrize("args, words, code", [
    (["--script", "never_ran.py"], "no run of a script containing 'never_ran.py'", 1),
    (["--script", "slow%loader"], "recorded: programs/slow_loader_train.py", 1),  # SQL LIKE would have matched
    (["--script", ""], "--script was given an empty text", 2),
    (["--history", "{folder}"], "is a folder; give the database file", 2),
    (["--last", "-1"], "--last must be >= 0", 2),
])
def test_history_misuse_is_one_line(history_db, args, words, code):
    args = [a.replace("{folder}", str(history_db.parent)) for a in args]
    before = digest(history_db)
    proc = run_cli_here("history", *(["--history", history_db] if "--history" not in args else []), *args)
    assert_one_clear_line(proc, words)
    assert proc.returncode == code and digest(history_db) == before


@pytest.mark.parametrize("args, runs", [
    (["--last", "99999999999999999999999"], 2),  # before: OverflowError from SQLite
    (["--last", "0"], 2),
    (["--script", "SLOW_LOADER"], 2),  # any case; `_` is itself, not any character
    (["--script", "_loader", "--last", "1"], 1),
])
def test_history_options_at_their_limits_have_their_documented_meaning(history_db, args, runs):
    proc = run_cli_here("history", "--history", history_db, "--json", *args)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert len(json.loads(proc.stdout)["runs"]) == runs


# ---------------------------------------------------------------- compressed inputs


def _xz(path: Path, data: bytes, size: int | None = None) -> Path:
    import lzma

    with lzma.open(path, "wb", preset=0) as fh:
        if size is None:
            fh.write(data)
        else:
            for _ in range(size // len(data)):
                fh.write(data)
    return path


@pytest.mark.slow  # a CLI process each (issue 54: the unit loop runs in-process)
@pytest.mark.parametrize("case", ["zeros", "damaged_export"])
def test_a_compressed_input_that_holds_no_report_is_one_line_naming_it_and_leaves_nothing(tmp_path, case):
    """Issue 42: a 300 MB xz of zeros was decompressed whole into the cache and left there, and the message named
    the cache's copy. The first megabyte now says what it is; a damaged export inside is named as the user's."""
    cache = tmp_path / "cache"
    if case == "zeros":  # 256 MiB of zeros, under 1 MiB compressed
        path, words = _xz(tmp_path / "bomb.sqlite.xz", bytes(1 << 20), 256 << 20), "not an SQLite export"
    else:
        path, words = _xz(tmp_path / "cut.sqlite.xz", USER.read_bytes()[:10240]), "(decompressed)"
    before = {p: digest(p) for p in tmp_path.rglob("*")}
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert_one_clear_line(proc, words, str(path))
    assert str(cache) not in proc.stderr  # the user's file, not our private copy
    assert {p: digest(p) for p in tmp_path.rglob("*") if cache not in p.parents and p != cache} == before
    if case == "zeros":  # nothing of the bomb is kept
        assert not [p for p in cache.rglob("*") if p.is_file()]


SHIFTED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME")
ABSOLUTE_TIMES = re.compile(r'"(start_ns|end_ns|span_start_ns|span_end_ns|trace_start_ns|trace_end_ns)": -?[0-9]+')


def _shifted(tmp_path: Path, where: str = "") -> Path:
    """The user's capture with its stamps moved 10^14 ns below 0 (every row, or the rows ``where`` picks)."""
    return changed(tmp_path, USER, *(f"UPDATE {t} SET start = start - {10 ** 14}, end = end - {10 ** 14} {where}"
                                     for t in _timed_tables()), name="shifted.sqlite")


def _timed_tables() -> list[str]:
    return [t for t in SHIFTED_TABLES if sql(USER, "SELECT count(*) FROM sqlite_master WHERE name = ?", t)[0][0]]


def test_a_capture_whose_clock_runs_below_zero_is_analyzed_as_the_same_capture(tmp_path):
    """Issue 52, item 10: every stamp moved below 0 was refused ("its timestamps look shifted or damaged"). It is
    read moved back, said in one warning: the same findings and the same summary as the capture itself, but for
    its absolute times, its path and that warning (compared by SQL's MIN: the move brings the earliest to 1 ns)."""
    from nvtx_trace.analyzer.summary import to_dict

    path = _shifted(tmp_path)
    low = min(sql(path, f"SELECT MIN(start) FROM {t}")[0][0] for t in _timed_tables())
    before = digest(path)
    summary, text = analyzed_by_cli(path, tmp_path)
    said = warned(summary, text, "the export's clock runs at or before 0")
    assert f"its earliest stamp {low} ns" in said and f"read {1 - low} ns later" in said and digest(path) == before
    got, want = to_dict(analyze(path)), to_dict(analyze(USER))
    assert [(f["kind"], f["impact_ns"]) for f in got["findings"]] == [(f["kind"], f["impact_ns"])
                                                                        for f in want["findings"]]
    got["warnings"], got["report"]["path"] = want["warnings"], want["report"]["path"]
    same = [ABSOLUTE_TIMES.sub("", json.dumps(d, sort_keys=True)) for d in (got, want)]
    assert same[0] == same[1]


def test_a_few_rows_below_zero_move_nothing():
    """A damaged row or three stay damaged rows (counted and left out), never a reason to move the whole clock."""
    from nvtx_trace.analyzer.trace.reader import Reader

    reader = Reader(USER)
    try:
        assert reader.clock_shift_ns == 0
    finally:
        reader.close()


def test_three_kernels_below_zero_are_left_out_not_a_moved_clock(tmp_path):
    path = _shifted(tmp_path, "WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 3)")
    summary, text = analyzed_by_cli(path, tmp_path)
    assert not [w for w in summary["warnings"] if "clock" in w]
    assert [w for w in summary["warnings"] if "without a valid start/end" in w]
