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


def test_every_relative_link_in_the_docs_names_a_file_that_exists():
    """README, docs/ and sample_reports/README: a link to a page never written (docs/run.md named
    analyze.md) is a dead end for the reader."""
    import re

    dead = []
    for page in [ROOT / "README.md", ROOT / "sample_reports" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and "://" not in path and not path.startswith("mailto:") and not (page.parent / path).exists():
                dead.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not dead, dead
