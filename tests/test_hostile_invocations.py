"""Issue 42's own hostile cases: what a hurried or unlucky user types, for every verb. Each is one line saying
what is wrong and what to do, the documented exit code, no traceback, nothing run, nothing written, every input
left byte-identical (the suite's end checks that no process or temporary file is left either).

Found by these, before: a Dask address without a port, an unbalanced --nsys-args quote and a 5,000-character
report path were tracebacks; `analyze ""` analyzed whatever was in the current folder; `--html -` wrote a file
named "-"; a knob given twice with two values ran the program with the last; `tune --budget 0` printed its
message's own placeholders; `--trace ""` profiled with the defaults; a folder given as the script was "command
not found" or "no script after the knobs".
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES

SAMPLE = SAMPLES / "cpu_slow_loader.sqlite"
OTHER = SAMPLES / "ddp_straggler_rank0_h200x2.sqlite"
USAGE, BAD_REPORT, FAILED = 2, 3, 1  # docs: exit codes


def _text(t: Path, name: str, body: str = "hello\n") -> Path:
    (t / name).write_text(body)
    return t / name


def _db(t: Path, name: str, sql: str) -> Path:
    conn = sqlite3.connect(t / name)
    conn.execute(sql)
    conn.commit()
    conn.close()
    return t / name


def _loop(t: Path) -> Path:
    os.symlink(t / "loop2", t / "loop1")
    os.symlink(t / "loop1", t / "loop2")
    return t / "loop1"


def _zip(t: Path) -> Path:
    with zipfile.ZipFile(t / "r.zip", "w") as z:
        z.writestr("report.sqlite", "not one")
    return t / "r.zip"


def _dir(t: Path, name: str = "folder") -> Path:
    (t / name).mkdir(exist_ok=True)
    return t / name


def script(t: Path) -> Path:
    """A program that leaves a mark when it runs: none of these cases may run it."""
    return _text(t, "train.py", f"open({str(t / 'RAN')!r}, 'w').write('ran')\n")


CASES = {  # name: (argv maker, exit code, words the one line holds)
    # analyze: its report
    "analyze_an_empty_report_path": (lambda t: ["analyze", ""], USAGE, "a report path is empty"),
    "analyze_a_path_too_long": (lambda t: ["analyze", "/tmp/" + "a" * 5000 + ".sqlite"], BAD_REPORT,
                                "name too long"),
    "analyze_a_link_loop": (lambda t: ["analyze", _loop(t)], BAD_REPORT, "symbolic link loop"),
    "analyze_a_zip": (lambda t: ["analyze", _zip(t)], BAD_REPORT, "not a SQLite file"),
    "analyze_a_text_file": (lambda t: ["analyze", _text(t, "notes.txt")], BAD_REPORT, "not a SQLite file"),
    "analyze_another_programs_database": (lambda t: ["analyze", _db(t, "app.sqlite", "create table t(x)")],
                                          BAD_REPORT, "not an Nsight Systems export"),
    "analyze_an_empty_folder": (lambda t: ["analyze", _dir(t)], BAD_REPORT, "no reports in it"),
    "analyze_a_glob_matching_nothing": (lambda t: ["analyze", str(t / "rank*.sqlite")], BAD_REPORT,
                                        "no report matches"),
    "analyze_a_missing_file": (lambda t: ["analyze", t / "none.sqlite"], BAD_REPORT, "no such file"),
    # analyze: its options
    "analyze_min_gap_negative": (lambda t: ["analyze", SAMPLE, "--min-gap-ms", "-1"], USAGE, "--min-gap-ms"),
    "analyze_min_gap_nan": (lambda t: ["analyze", SAMPLE, "--min-gap-ms", "nan"], USAGE, "--min-gap-ms"),
    "analyze_min_gap_inf": (lambda t: ["analyze", SAMPLE, "--min-gap-ms", "inf"], USAGE, "--min-gap-ms"),
    "analyze_min_gap_a_word": (lambda t: ["analyze", SAMPLE, "--min-gap-ms", "one"], USAGE, "--min-gap-ms"),
    "analyze_loader_pattern_unclosed": (lambda t: ["analyze", SAMPLE, "--loader-pattern", "("], USAGE,
                                        "not a valid regular expression"),
    "analyze_workers_negative": (lambda t: ["analyze", SAMPLE, "--workers", "-2"], USAGE, "--workers"),
    "analyze_scheduler_without_a_port": (lambda t: ["analyze", SAMPLE, OTHER, "--scheduler", "host:address"], USAGE,
                                         "tcp://HOST:PORT"),
    "analyze_scheduler_port_out_of_range": (lambda t: ["analyze", SAMPLE, OTHER, "--scheduler", "tcp://h:70000"],
                                            USAGE, "tcp://HOST:PORT"),
    "analyze_scheduler_local_zero": (lambda t: ["analyze", SAMPLE, OTHER, "--scheduler", "local:0"], USAGE,
                                     "local:N"),
    "analyze_warmup_beyond_int64": (lambda t: ["analyze", SAMPLE, "--warmup-steps", "9" * 20], USAGE,
                                    "leaves no steady step"),
    # analyze: its outputs
    "analyze_json_into_a_folder": (lambda t: ["analyze", SAMPLE, "--json", _dir(t)], USAGE, "is a directory"),
    "analyze_json_and_html_one_file": (lambda t: ["analyze", SAMPLE, "--json", t / "o", "--html", t / "o"], USAGE,
                                       "same file"),
    "analyze_html_to_stdout": (lambda t: ["analyze", SAMPLE, "--html", "-"], USAGE, "--html -"),
    "analyze_html_empty": (lambda t: ["analyze", SAMPLE, "--html", ""], USAGE, "empty path"),
    "analyze_json_over_a_file_without_force": (lambda t: ["analyze", SAMPLE, "--json", _text(t, "o.json")], USAGE,
                                               "already exists"),
    "analyze_json_over_its_own_report": (lambda t: ["analyze", SAMPLE, "--json", SAMPLE, "--force"], USAGE,
                                         "the same file"),
    # history
    "history_a_text_file": (lambda t: ["history", "--history", _text(t, "h.txt")], FAILED, "not a usable SQLite"),
    "history_another_programs_database": (lambda t: ["history", "--history", _db(t, "h.db", "create table runs(x)")],
                                          FAILED, "not an nvtx-trace run history"),
    "history_a_folder": (lambda t: ["history", "--history", _dir(t)], USAGE, "is a folder"),
    "history_last_a_word": (lambda t: ["history", "--last", "all"], USAGE, "--last"),
    # diff
    "diff_two_missing_paths": (lambda t: ["diff", t / "a", t / "b"], BAD_REPORT, "no such file"),
    "diff_a_folder_without_a_run": (lambda t: ["diff", _dir(t), SAMPLE], BAD_REPORT, "a folder without"),
    "diff_a_json_that_is_no_summary": (lambda t: ["diff", _text(t, "x.json", '{"a": 1}'), SAMPLE], BAD_REPORT,
                                       "not an nvtx-trace summary.json"),
    "diff_html_to_stdout": (lambda t: ["diff", SAMPLE, OTHER, "--json", "-", "--html", "-"], USAGE, "--html -"),
    "diff_json_empty": (lambda t: ["diff", SAMPLE, OTHER, "--json", ""], USAGE, "empty path"),
    "diff_json_over_an_input": (lambda t: ["diff", SAMPLE, OTHER, "--json", OTHER, "--force"], USAGE, "same file"),
    # redact
    "redact_onto_its_input": (lambda t: ["redact", SAMPLE, "-o", SAMPLE, "--force"], USAGE, "the same file"),
    "redact_a_text_file": (lambda t: ["redact", _text(t, "notes.txt"), "-o", t / "o.sqlite"], BAD_REPORT,
                           "not a SQLite file"),
    "redact_into_a_missing_folder": (lambda t: ["redact", SAMPLE, "-o", t / "no" / "o.sqlite"], USAGE,
                                     "does not exist"),
    # try
    "try_knobs_without_a_script": (lambda t: ["try", "num_workers=4"], USAGE, "no script after the knobs"),
    "try_a_knob_without_a_value": (lambda t: ["try", "num_workers=", script(t)], USAGE, "expected KNOB=VALUE"),
    "try_one_knob_two_values": (lambda t: ["try", "num_workers=2", "num_workers=4", script(t)], USAGE,
                                "num_workers given twice"),
    "try_one_knob_two_values_in_one_word": (lambda t: ["try", "amp=bf16,amp=fp16", script(t)], USAGE,
                                            "amp given twice"),
    "try_rounds_zero": (lambda t: ["try", "--rounds", "0", "num_workers=2", script(t)], USAGE, "--rounds"),
    "try_rounds_negative": (lambda t: ["try", "--rounds", "-1", "num_workers=2", script(t)], USAGE, "--rounds"),
    "try_from_a_missing_summary": (lambda t: ["try", "--from", t / "s.json", "num_workers=2", script(t)],
                                   BAD_REPORT, "not a readable summary.json"),
    "try_from_a_json_that_is_no_summary": (lambda t: ["try", "--from", _text(t, "s.json", "{}"), "num_workers=2",
                                                      script(t)], BAD_REPORT, "not an nvtx-trace summary.json"),
    "try_advice_with_knobs": (lambda t: ["try", "--advice", "num_workers=2", script(t)], USAGE,
                              "give neither knobs nor --from"),
    "try_negative_workers": (lambda t: ["try", "num_workers=-1", script(t)], USAGE, "too small"),
    "try_amp_fp8": (lambda t: ["try", "amp=fp8", script(t)], USAGE, "expected bf16 or fp16"),
    "try_compile_maybe": (lambda t: ["try", "compile=maybe", script(t)], USAGE, "expected 1 or 0 or a mode"),
    "try_tf32_two": (lambda t: ["try", "tf32=2", script(t)], USAGE, "expected 1 or 0"),
    "try_a_missing_script": (lambda t: ["try", "num_workers=2", t / "none.py"], USAGE, "no such file"),
    "try_a_folder_as_the_script": (lambda t: ["try", "num_workers=2", _dir(t)], USAGE, "is a folder"),
    # tune
    "tune_budget_zero": (lambda t: ["tune", "--budget", "0", script(t)], USAGE, "give --budget 60 or more"),
    "tune_budget_negative": (lambda t: ["tune", "--budget", "-5", script(t)], USAGE, "give --budget 60 or more"),
    "tune_rounds_zero": (lambda t: ["tune", "--rounds", "0", script(t)], USAGE, "--rounds"),
    "tune_a_missing_script": (lambda t: ["tune", t / "none.py"], USAGE, "no such file"),
    "tune_nothing_to_run": (lambda t: ["tune"], USAGE, "got nothing"),
    # run (all refused before nsys starts)
    "run_negative_steps": (lambda t: ["run", "--warmup-steps", "1", "--steps", "-5", script(t)], USAGE, "--steps"),
    "run_min_gap_nan": (lambda t: ["run", "--min-gap-ms", "nan", script(t)], USAGE, "--min-gap-ms"),
    "run_trace_nothing": (lambda t: ["run", "--trace", "", script(t)], USAGE, "names nothing to trace"),
    "run_trace_only_commas": (lambda t: ["run", "--trace", ",,", script(t)], USAGE, "names nothing to trace"),
    "run_nsys_args_unbalanced_quote": (lambda t: ["run", "--nsys-args", '"--sample', script(t)], USAGE,
                                       "No closing quotation"),
    "run_python_that_is_a_text_file": (lambda t: ["run", "--python", _text(t, "notes.txt"), script(t)], USAGE,
                                       "does not run"),
    "run_a_folder_as_the_script": (lambda t: ["run", _dir(t)], USAGE, "is a folder"),
    "run_m_without_a_module": (lambda t: ["run", "-m"], USAGE, "nothing to run"),
    "run_per_rank_without_torchrun": (lambda t: ["run", "--per-rank", script(t)], USAGE, "give a torchrun command"),
    "run_try_a_word_for_a_number": (lambda t: ["run", "--try", "num_workers=x", script(t)], USAGE,
                                    "expected a whole number"),
    "run_out_is_a_file": (lambda t: ["run", "--out", _text(t, "notes.txt"), script(t)], USAGE, "is a file"),
    "run_history_is_a_folder": (lambda t: ["run", "--history", _dir(t), script(t)], USAGE, "is a directory"),
    "run_history_is_the_script": (lambda t: ["run", "--history", t / "train.py", script(t)], USAGE, "train.py"),
    # the command line itself
    "an_unknown_verb": (lambda t: ["profile", SAMPLE], USAGE, "No such command 'profile'"),
}


def tree_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder")
            for p in sorted(folder.rglob("*")) if not p.is_symlink()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_invocation_is_one_line_and_changes_nothing(tmp_path, case):
    make, code, words = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    argv = [str(a) for a in make(work)]
    before, samples = tree_digest(work), {p: p.stat().st_mtime_ns for p in (SAMPLE, OTHER)}
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *argv], cwd=work, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "NVTX_TRACE_HISTORY": str(tmp_path / "history.db"), "COLUMNS": "400",
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1 and lines[0].startswith("nvtx-trace: error: "), proc.stderr[-2000:]
    assert words in lines[0], lines[0]
    assert tree_digest(work) == before, "an input changed, or something was written"
    assert not (work / "RAN").exists() and not (tmp_path / "history.db").exists()
    assert {p: p.stat().st_mtime_ns for p in (SAMPLE, OTHER)} == samples


def test_a_report_given_twice_is_analyzed_once(tmp_path):
    """Not refused: the same file under two spellings is one report, not two ranks of a run."""
    twice = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(SAMPLE),
                            f"{SAMPLES}/../sample_reports/{SAMPLE.name}", "--json", "-"], capture_output=True,
                           text=True, timeout=300)
    once = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(SAMPLE), "--json", "-"],
                          capture_output=True, text=True, timeout=300)
    assert twice.returncode == once.returncode == 0, twice.stderr[-2000:]
    a, b = json.loads(twice.stdout), json.loads(once.stdout)
    assert a["steps"] == b["steps"] and a["findings"] == b["findings"]
