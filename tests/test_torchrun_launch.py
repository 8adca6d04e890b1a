"""torchrun command lines taken apart where nsys goes in (``run --per-rank``): which words are torchrun's,
which are the program's. Checked against torchrun's own parser where torch is installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from nvtx_trace.capture import torchrun


@pytest.mark.parametrize("target, launcher, kind, program, nproc", [
    (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"],
     ["torchrun", "--nproc-per-node", "2"], "script", ["train.py", "--lr", "1"], "2"),
    (["torchrun", "--nproc_per_node=4", "--standalone", "train.py", "--nproc_per_node", "9"],
     ["torchrun", "--nproc_per_node=4", "--standalone"], "script", ["train.py", "--nproc_per_node", "9"], "4"),
    (["torchrun", "--nnodes", "2", "--rdzv-endpoint", "host:29400", "-m", "pkg.train", "-m", "x"],
     ["torchrun", "--nnodes", "2", "--rdzv-endpoint", "host:29400"], "module", ["pkg.train", "-m", "x"], None),
    (["torchrun", "--no-python", "--nproc-per-node", "2", "bash", "job.sh"],
     ["torchrun", "--nproc-per-node", "2"], "command", ["bash", "job.sh"], "2"),
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node=gpu", "--", "train.py"],
     ["python3", "-m", "torch.distributed.run", "--nproc-per-node=gpu"], "script", ["train.py"], "gpu"),
    (["/opt/venv/bin/torchrun", "--run-path", "train.py"], ["/opt/venv/bin/torchrun"], "script", ["train.py"], None),
])
def test_torchruns_words_and_the_programs_are_told_apart(target, launcher, kind, program, nproc):
    launch = torchrun.parse(target)
    assert (launch.launcher, launch.kind, launch.program, launch.nproc) == (launcher, kind, program, nproc)


def test_what_is_no_torchrun_is_left_alone():
    assert torchrun.parse(["python", "train.py"]) is None
    assert torchrun.parse(["mpirun", "-n", "2", "python", "train.py"]) is None
    assert torchrun.parse([]) is None
    assert torchrun.parse(["torchrun", "--nproc-per-node", "2"]).program == []  # nothing to run: the plan says so


def test_each_rank_runs_python_unbuffered_with_autotrace_as_torchrun_would():
    script = torchrun.parse(["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"])
    assert script.rank_argv("/py") == ["/py", "-u", "-m", "nvtx_autotrace", "train.py", "--lr", "1"]
    assert script.rank_argv("/py", autotrace=False) == ["/py", "-u", "train.py", "--lr", "1"]
    module = torchrun.parse(["torchrun", "-m", "pkg.train", "--lr", "1"])
    assert module.rank_argv("/py") == ["/py", "-u", "-m", "nvtx_autotrace", "-m", "pkg.train", "--lr", "1"]
    command = torchrun.parse(["torchrun", "--no-python", "bash", "job.sh"])
    assert command.rank_argv("/py") == ["bash", "job.sh"]  # nvtx_autotrace comes in through sitecustomize


def test_the_ranks_python_is_the_one_in_torchruns_first_line(tmp_path):
    launcher = tmp_path / "torchrun"
    launcher.write_text("#!/opt/env/bin/python3.12\nimport sys\n")
    assert torchrun.parse([str(launcher), "t.py"]).python == "/opt/env/bin/python3.12"
    launcher.write_text("#!/bin/sh\nexec something\n")
    assert torchrun.parse([str(launcher), "t.py"]).python == sys.executable


def test_a_short_option_with_its_value_attached_is_one_word():
    launch = torchrun.parse(["torchrun", "-r3", "--nproc-per-node", "2", "train.py", "--lr", "1"])
    assert launch.launcher == ["torchrun", "-r3", "--nproc-per-node", "2"] and launch.program == ["train.py", "--lr", "1"]


@pytest.mark.parametrize("target, local_ranks", [
    (["torchrun", "--nproc-per-node", "4", "t.py"], 4),
    (["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2", "t.py"], 2),
    (["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "t.py"], 4),  # a block of 4: 0..3 or 4..7
    (["torchrun", "--nproc-per", "3", "t.py"], 3),  # an abbreviation argparse resolves
    (["torchrun", "--nproc-per-node", "gpu", "t.py"], None),
    (["torchrun", "t.py"], None),
])
def test_how_many_rank_reports_this_host_should_write(target, local_ranks, monkeypatch):
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    assert torchrun.parse(target).local_ranks == local_ranks


def test_torchruns_environment_default_counts_when_the_command_line_is_silent(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")  # torchrun reads its options' defaults from PET_*
    assert torchrun.parse(["torchrun", "t.py"]).local_ranks == 2
    assert torchrun.parse(["torchrun", "--nproc-per-node", "4", "t.py"]).local_ranks == 4


def test_rank_file_names():
    assert torchrun.rank_of(Path("out/rank12.nsys-rep")) == 12
    assert torchrun.rank_of(Path("rank0.sqlite")) == 0
    assert torchrun.rank_of(Path("report.sqlite")) is None and torchrun.rank_of(Path("rankx.sqlite")) is None
    assert torchrun.rank_stem(Path("out")) == Path("out/rank%q{RANK}")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_the_split_agrees_with_torchruns_own_parser():
    """Independent check: torchrun's argparse, on the same words, names the same script and arguments."""
    from torch.distributed.run import get_args_parser

    for target in (["torchrun", "--nproc-per-node", "2", "--max-restarts=1", "train.py", "--lr", "1"],
                   ["torchrun", "--standalone", "--nnodes", "1", "--master-port", "1234", "-m", "pkg", "-x"],
                   ["torchrun", "--no-python", "--rdzv-backend", "c10d", "bash", "job.sh", "--a"],
                   ["torchrun", "-r3", "-t", "3", "--nproc-per-node", "2", "train.py", "-r", "1"],
                   ["torchrun", "--stand", "--nnodes=2", "--nproc_per_node=4", "train.py"],  # an abbreviation
                   ["torchrun", "-mr3", "--node_rank", "1", "--nproc-per", "8", "pkg.train"]):  # -m, then -r3
        theirs = get_args_parser().parse_args(target[1:])
        launch = torchrun.parse(target)
        assert launch.program == [theirs.training_script, *theirs.training_script_args]
        assert launch.kind == ("module" if theirs.module else "command" if theirs.no_python else "script")
        assert (launch.nproc or "1", launch.nnodes or "1:1") == (theirs.nproc_per_node, theirs.nnodes)
