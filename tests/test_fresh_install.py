"""A new user's first hour, for real: fresh virtual environments, the README's own commands, a real nsys run.

* The declared minimum versions (pyproject's floors, installed exactly) in an environment that has
  nothing else, then README's first line word for word, then every sample report's summary against the
  recorded one (tests/golden_questions) and an HTML page: the floors are floors that work.
* An environment that sees the system's torch (700 MB: not downloaded per test), the README's install
  alone (it brings nvtx), and `nvtx-trace run` of a small training script with DataLoader workers
  under the real nsys, on the first try.

Both need the package registry (pip), as CI's own set-up does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from conftest import ROOT, need

pytestmark = [pytest.mark.slow]


def readme_command(n: int) -> str:
    """The README's n-th set-up command (its first code block)."""
    block = re.search(r"```\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return block.strip().splitlines()[n]


def floors() -> list[str]:
    """pyproject's dependencies with each floor as an exact pin: `pandas>=2.2` -> `pandas==2.2`."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.sub(r">=", "==", d.split(";")[0]).strip() for d in deps]


def venv(path: Path, system_site: bool = False) -> dict:
    """A virtual environment at ``path``; the environment variables of a shell that activated it."""
    args = [sys.executable, "-m", "venv", str(path)] + (["--system-site-packages"] if system_site else [])
    subprocess.run(args, check=True, timeout=120)
    if system_site and sys.prefix != sys.base_prefix:
        # The suite itself runs in a virtual environment (as the README advises on PEP 668 systems): a new one
        # made from it sees the base interpreter's packages, not this one's (torch). They come after its own.
        import site
        import sysconfig

        own = subprocess.run([str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        outer = [d for d in site.getsitepackages() if d != sysconfig.get_path("purelib", vars={"base": sys.base_prefix})]
        Path(own, "outer-environment.pth").write_text("".join(f"{d}\n" for d in outer))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(path), PATH=f"{path / 'bin'}:{env.get('PATH', '')}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def sh(command: str, env: dict, timeout: int = 600, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_readme_first_line_works_on_the_declared_minimum_versions(tmp_path):
    env = venv(tmp_path / "venv")
    pins = sh("python3 -m pip install -q " + " ".join(f"'{p}'" for p in floors()), env)
    assert pins.returncode == 0, pins.stderr[-3000:]
    first = sh(readme_command(0), env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Findings" in first.stdout and "dataloader_stall" in first.stdout
    versions = sh("python3 -m pip list --format=freeze", env).stdout
    for pin in floors():  # the README's install kept the floors: they are what ran
        name, version = pin.split("==")
        assert re.search(rf"(?im)^{re.escape(name)}=={re.escape(version)}(\.0)*$", versions), (pin, versions)
    golden = sh("python3 tests/golden_compare.py", env)
    assert golden.returncode == 0, golden.stdout[-3000:] + golden.stderr[-2000:]
    page = tmp_path / "page.html"
    html = sh(f"nvtx-trace analyze sample_reports/resnet_ddp_flawed.sqlite --html {page}", env)
    assert html.returncode == 0 and page.stat().st_size > 10_000, html.stderr[-2000:]


def test_a_new_user_runs_a_script_with_workers_after_the_readme_install(tmp_path):
    need("nsys", shutil.which("nsys") is not None)
    need("torch", subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0)
    env = venv(tmp_path / "venv", system_site=True)
    install = sh(readme_command(0).split(" && ")[0], env)  # the README's install alone: nvtx comes with it
    assert install.returncode == 0, install.stderr[-3000:]
    assert (tmp_path / "venv" / "bin" / "nvtx-trace").exists()
    out = tmp_path / "first-run"
    run = sh(f"nvtx-trace run --out {out} programs/slow_loader_train.py --steps 8", env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "step 7 loss" in run.stderr and "done" in run.stdout  # the script's own output reaches the user
    assert "dataloader_stall" in run.stdout and "Training waits" in run.stdout
    assert sorted(p.name for p in out.iterdir() if p.suffix in (".nsys-rep", ".sqlite", ".json", ".html")) == [
        "report.nsys-rep", "report.sqlite", "summary.html", "summary.json"]
