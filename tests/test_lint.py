"""ruff with the project's rule set ([tool.ruff] in pyproject.toml): zero findings."""

from __future__ import annotations

import shutil
import subprocess

from conftest import ROOT, need


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    need("ruff", ruff is not None)
    proc = subprocess.run([ruff, "check", "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
