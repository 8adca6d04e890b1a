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
