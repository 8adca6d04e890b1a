"""Help a user can read: no type tags on flags, one word for what a value is, an example per verb, --version."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from nvtx_trace import __version__

VERBS = ["analyze", "run", "try", "tune", "diff", "history", "redact", "doctor"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *args], capture_output=True, text=True,
                          timeout=60, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("verb", VERBS)
def test_cli_help_has_no_type_tags_and_an_example(verb):
    proc = cli(verb, "--help")
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"<(bool|str|path|int|float|list\[str\])>", proc.stdout), proc.stdout
    assert "Example" in proc.stdout  # every verb shows one
    usage = next(line for line in proc.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage, usage  # REPORT, as the arguments' own column names it, not {REPORT}


def test_cli_version():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"nvtx-trace {__version__}"


@pytest.mark.slow  # a process of its own (issue 54: the unit loop runs in-process)
def test_output_that_is_no_terminal_is_not_wrapped_at_80_columns():
    """Issue 42: piped into a log, rich wrapped at 80 columns and put a GPU's name over three lines. Without a
    terminal (and without COLUMNS) lines run to WIDE columns; COLUMNS, when set, is obeyed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from nvtx_trace.report.console import WIDE

    sample = Path(__file__).resolve().parents[1] / "sample_reports" / "resnet50_2workers_h100.sqlite"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(sample)], capture_output=True,
                           text=True, timeout=300, env=env)
    assert piped.returncode == 0, piped.stderr[-2000:]
    lines = piped.stdout.splitlines()
    assert any("NVIDIA H100 80GB HBM3" in ln for ln in lines)  # the name on one line
    assert 80 < max(map(len, lines)) <= WIDE
    narrow = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", str(sample)], capture_output=True,
                            text=True, timeout=300, env={**env, "COLUMNS": "100"})
    assert max(map(len, narrow.stdout.splitlines())) <= 100


@pytest.mark.parametrize("args, said", [
    (["run", "--warmup-step", "3", "train.py"], "No such option: --warmup-step (Possible options: --warmup-steps"),
    (["tune", "--budgt", "600", "train.py"], "No such option: --budgt (Possible options: --budget)"),
    (["try", "--rouds", "3", "tf32=1", "train.py"], "No such option: --rouds (Possible options: --rounds)"),
    (["run", "--out=x", "--jsn", "y", "train.py"], "No such option: --jsn;"),
])
def test_a_mistyped_option_of_ours_is_said_as_one_before_anything_runs(args, said, tmp_path):
    """Issue 52: run, try and tune pass everything after the script to it, so a typo landed where the script goes:
    "--warmup-step: command not found", "got --budgt", "no knob given". Now as analyze says it, nothing made."""
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_the_options_run_try_and_tune_share_are_one_declaration():
    """Issue 54, item 3: --out, --force, --history and --no-history mean the same in the three verbs (one
    declaration, nvtx_trace/cli/shared_options.py): the same flags, the same defaults, the same help but for the
    folder's name and what --force allows. Read from the commands click builds, in this process."""
    import typer

    from nvtx_trace.cli import app

    group = typer.main.get_command(app)
    shared = ("--out", "--force", "--history", "--no-history")
    seen = {}
    for verb in ("run", "try", "tune"):
        params = {p.opts[0]: p for p in group.commands[verb].params if p.opts and p.opts[0] in shared}
        assert sorted(params) == sorted(shared), verb
        seen[verb] = {name: (tuple(p.opts), p.default, re.sub(r"default: \./nvtx-trace-out/\S+|Allow .*", "", p.help))
                      for name, p in params.items()}
    assert seen["run"] == seen["try"] == seen["tune"]
