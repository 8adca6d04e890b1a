"""Run history, without nsys: where the database lives, what a row holds, what the change line says, and a
history that cannot be written (read-only folder, a file that is no database) warns in one line, never fails.

The rows come from the real summaries of the shipped samples (put together from tests/golden_questions);
the real `nvtx-trace run` twice is in test_history_run.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from nvtx_trace import runner
from nvtx_trace.cli import main as cli_main
from nvtx_trace.runner import history, history_rows, history_store
from nvtx_trace.units import ms

SCRIPT = ROOT / "programs" / "slow_loader_train.py"


def summary(name: str) -> dict:
    from question_snapshots import recorded_summary

    return recorded_summary(name)


def finished(out_dir: Path, name: str | None, exit_code: int = 0) -> runner.RunResult:
    """A run as the runner returns it: the plan for SCRIPT, its summary.json written (a sample's) or not."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = runner.Plan(nsys=None, out_dir=out_dir, argv=[sys.executable, "-m", "nvtx_autotrace", str(SCRIPT)],
                       env={}, trace=["nvtx"], extra=[], capture="the whole run", mode="script",
                       options=runner.RunOptions(target=[str(SCRIPT), "--steps", "12"]))
    result = runner.RunResult(plan=plan, exit_code=exit_code)
    if name:
        (out_dir / "summary.json").write_text(json.dumps(summary(name)))
        result.written.append(out_dir / "summary.json")
    return result


def test_location_follows_the_platform_and_can_be_overridden_or_switched_off(tmp_path):
    home = {"HOME": "/home/u"}
    assert history.default_path(home, "linux") == Path("/home/u/.local/share/nvtx-trace/history.db")
    assert history.default_path({**home, "XDG_DATA_HOME": "/x"}, "linux") == Path("/x/nvtx-trace/history.db")
    assert history.default_path(home, "darwin") == Path("/home/u/Library/Application Support/nvtx-trace/history.db")
    assert history.default_path({**home, "LOCALAPPDATA": "C:/L"}, "win32") == Path("C:/L/nvtx-trace/history.db")
    env = {**home, history_store.ENV: str(tmp_path / "h.db")}
    assert history.resolve_path(None, environ=env) == tmp_path / "h.db"
    assert history.resolve_path(tmp_path / "o.db", environ=env) == tmp_path / "o.db"  # --history wins
    assert history.resolve_path(tmp_path / "o.db", disabled=True, environ=env) is None  # --no-history
    assert history.resolve_path(None, environ={**home, history_store.ENV: "off"}) is None


def test_the_test_session_never_writes_the_real_history(private_history):
    assert os.environ[history_store.ENV] == str(private_history)
    assert history.resolve_path() == private_history


def test_a_row_holds_the_run_and_its_findings_as_the_summary_says(tmp_path):
    db = tmp_path / "h.db"
    result = finished(tmp_path / "run1", "cpu_slow_loader")
    change, warning = history.after_run(result, db, started=1_000.0)
    assert (change, warning) == (None, None)  # the first run of this script: nothing to compare with
    [run] = history_store.query(db)
    want = summary("cpu_slow_loader")
    assert run["script"] == str(SCRIPT.resolve()) and run["args"] == ["--steps", "12"]
    assert run["step_ns_median"] == want["steps"]["summary"]["step_ns_median"]
    assert run["step_ns_mean"] == want["steps"]["summary"]["step_ns_mean"]
    assert run["knobs"] == {"num_workers": want["dataloader"]["loaders"][0]["workers"]} == {"num_workers": 2}
    assert [(f["kind"], f["impact_ns"]) for f in run["findings"]] == [(f["kind"], f["impact_ns"])
                                                                      for f in want["findings"]]
    assert run["out_dir"] == str(tmp_path / "run1") and run["exit_code"] == 0
    if importlib.util.find_spec("torch") is not None:  # this interpreter's torch, read not imported
        assert run["torch_version"] and run["torch_version"].startswith("2.")
    else:
        assert run["torch_version"] is None
    # the same row, by plain SQL on the file (the documented tables)
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT script, step_ns_median FROM runs").fetchall() == [
            (str(SCRIPT.resolve()), want["steps"]["summary"]["step_ns_median"])]
        assert con.execute("SELECT count(*) FROM findings WHERE run_id = 1").fetchone()[0] == len(want["findings"])


def test_the_next_run_of_the_same_script_prints_what_changed(tmp_path):
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "resnet50_2workers_h100"), db, started=1_000.0)
    change, warning = history.after_run(finished(tmp_path / "b", "resnet50_8workers_h100"), db, started=2_000.0)
    assert warning is None and change is not None and "\n" not in change
    before, after = summary("resnet50_2workers_h100"), summary("resnet50_8workers_h100")
    from nvtx_trace.runner.diff import compare

    diff = compare(before, after)  # the documented diff of the two summaries: the line must say the same
    stat = diff["step_statistic"]
    b_ns, a_ns = before["steps"]["summary"][f"step_ns_{stat}"], after["steps"]["summary"][f"step_ns_{stat}"]
    assert f"step {ms(b_ns)} -> {ms(a_ns)} ({(a_ns - b_ns) / b_ns:+.0%}, {stat})" in change
    resolved = [f["kind"] for f in diff["findings"] if f["status"] == "resolved"]
    assert resolved and f"resolved: {', '.join(resolved)}" in change
    assert str(tmp_path / "a") in change  # where the earlier run's outputs are
    assert len(history_store.query(db)) == 2 and len(history_store.query(db, last=1)) == 1
    assert history_store.query(db, script="no-such-script") == []


def test_a_run_is_compared_with_the_last_complete_one_and_says_which(tmp_path):
    """Issue 52, item 17: after an interrupted run, the next compared itself with it ("+31 %, improved:
    dataloader_stall"). An interrupted or crashed run is skipped, and the line says so; an interrupted run itself
    says how it ended."""
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "resnet50_2workers_h100"), db, started=1_000.0)
    change, _ = history.after_run(finished(tmp_path / "b", "resnet50_8workers_h100", exit_code=130), db, started=2_000.0)
    assert change.startswith("since the last run of this script (") and str(tmp_path / "a") in change
    assert ", this run ending with status 130:" in change
    change, _ = history.after_run(finished(tmp_path / "c", "resnet50_8workers_h100"), db, started=3_000.0)
    assert change.startswith("since the last complete run of this script (") and str(tmp_path / "a") in change
    assert "the 1 later run(s) ended early)" in change and str(tmp_path / "b") not in change
    assert "resolved:" in change  # against a's findings, not b's (the same as c's: "unchanged")


def test_a_history_that_cannot_be_written_is_one_warning_not_a_failure(tmp_path):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    before = garbage.read_bytes()
    change, warning = history.after_run(finished(tmp_path / "r", "cpu_slow_loader"), garbage, started=1.0)
    assert change is None and "not a usable SQLite database" in warning and "\n" not in warning
    assert garbage.read_bytes() == before  # never modified
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who may write a read-only folder (root)")
        change, warning = history.after_run(finished(tmp_path / "r2", None), locked / "h.db", started=1.0)
        assert change is None and warning and "--no-history" in warning
    finally:
        locked.chmod(0o700)


def test_a_read_only_history_folder_as_root_is_one_warning(tmp_path):
    """Root writes read-only folders; a path under a file fails for every user alike."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    change, warning = history.after_run(finished(tmp_path / "r", "cpu_slow_loader"), blocker / "h.db", started=1.0)
    assert change is None and warning.startswith(f"history {blocker / 'h.db'}") and "\n" not in warning


def test_history_verb_lists_filters_and_prints_json(tmp_path, capsys):
    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "cpu_slow_loader"), db, started=1_000.0)
    history.after_run(finished(tmp_path / "b", "cpu_slow_loader", exit_code=3), db, started=2_000.0)
    assert cli_main(["history", "--history", str(db), "--json", "--last", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in data["runs"]] == [2] and data["runs"][0]["exit_code"] == 3
    assert cli_main(["history", "--history", str(db), "--script", "slow_loader"]) == 0
    out = capsys.readouterr().out
    assert "2 run(s)" in out and "slow_loader_train.py" in out and "dataloader_stall" in out
    assert cli_main(["history", "--history", str(tmp_path / "none.db")]) == 0
    assert "No runs recorded" in capsys.readouterr().out
    garbage = tmp_path / "g.db"
    garbage.write_bytes(b"x" * 4096)
    assert cli_main(["history", "--history", str(garbage)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nvtx-trace: error: history") and "not a usable" in err[0]


def test_the_documented_tables_are_the_written_ones(tmp_path):
    """docs/json-schema.md, "Run history", names exactly the columns a run and a try write."""
    import re

    db = tmp_path / "h.db"
    history.after_run(finished(tmp_path / "a", "resnet_flawed"), db, started=1.0)
    variant = {"knobs": {"tf32": True}, "label": "tf32=1", "statistic": "median", "rounds_ms": [5.0],
               "measured_step_ms": 5.0, "speedup": 2.0, "finding": "precision", "predicted_step_ms": 4.5,
               "verdict": "confirmed"}
    baseline = {**variant, "knobs": {}, "label": "baseline", "measured_step_ms": 10.0, "speedup": None,
                "finding": None, "predicted_step_ms": None, "verdict": None}
    assert history.after_try({"variants": [baseline, variant]}, ["programs/cpu_train.py"], tmp_path / "t", db,
                             2.0) is None
    with sqlite3.connect(db) as con:
        written = {t: {r[1] for r in con.execute(f"PRAGMA table_info({t})")} for t in ("runs", "findings")}
    doc = (ROOT / "docs" / "json-schema.md").read_text().split("## Run history", 1)[1]
    runs_table = doc.split("Table `runs`", 1)[1].split("Table `findings`", 1)[0]
    documented = set()
    for line in runs_table.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    assert documented == written["runs"]
    findings_text = doc.split("Table `findings`", 1)[1].split("`nvtx-trace history --json`", 1)[0]
    named = {m for m in re.findall(r"`([a-z_]+)`", findings_text)}
    assert written["findings"] <= named


def test_the_same_script_is_its_path_its_module_and_folder_or_its_command_up_to_the_script(tmp_path):
    (tmp_path / "train.py").write_text("")
    assert history_rows.script_key(["train.py", "--lr", "1"], "script", tmp_path) == str(tmp_path / "train.py")
    assert history_rows.script_key(["pkg.train", "--lr", "1"], "module", tmp_path) == f"-m pkg.train @ {tmp_path}"
    one = history_rows.script_key(["torchrun", "--nproc_per_node=2", "train.py", "--lr", "1"], "command", tmp_path)
    two = history_rows.script_key(["torchrun", "--nproc_per_node=2", "train.py", "--lr", "2"], "command", tmp_path)
    assert one == two == f"torchrun --nproc_per_node=2 {tmp_path / 'train.py'}"


def test_history_lists_a_tune_stage_as_a_tune_trial_with_its_verdict(tmp_path, capsys):
    """Issue 52, item 18: `history` showed a tune stage as "no findings", never saying it was a tune trial, kept
    or not. A real H200 tune.json, recorded as tune records it."""
    db = tmp_path / "h.db"
    result = json.loads((ROOT / "sample_reports" / "tune" / "image_folder_h200.tune.json").read_text())
    assert history.after_tune(result, ["programs/options/image_folder_train.py", "-j", "4"], tmp_path / "t", db,
                              1.0) is None
    assert cli_main(["history", "--history", str(db)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("#")]
    stages = [s for s in result["stages"] if s["knobs"]]
    assert len(lines) == len(stages) and not any("no findings" in ln for ln in lines)
    for line, s in zip(reversed(lines), stages):  # newest first
        assert "  tune " in line and line.endswith("kept" if s["kept"] else "rejected"), line


def test_a_script_name_with_control_characters_cannot_forge_a_line_of_the_history(tmp_path, capsys):
    """Issue 52, item 11: the history's script names reached the terminal raw; a name holding a newline printed a
    line of its own ("no problems found"), an escape sequence could clear the screen. Shown with them escaped."""
    db = tmp_path / "h.db"
    history.after_tune(json.loads((ROOT / "sample_reports" / "tune" / "image_folder_h200.tune.json").read_text()),
                       ["train\n#99  no problems found\x1b[2J.py"], tmp_path / "t", db, 1.0)
    assert cli_main(["history", "--history", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith("#99") for line in out.splitlines())
    assert "train\\n#99  no problems found\\x1b[2J.py" in out
