"""One answer from every door (issue 32): `nvtx-trace analyze` of the report a run wrote gives the run's own
answer. The run knows where its capture window opened (after warm-up); the report says so itself
(nvtx_autotrace's `nvtx_autotrace.window` record), so reading it again leaves out the same steps, finds the same
figures and predicts the same steps. Real runs under the real nsys 2022.4 on this CPU machine.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import ROOT

SKIP = {"report"}  # where the report lies: the one key that names the door


def nvtx_trace(*words, cwd, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", *words], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def differences(a, b, where="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if not where and k in SKIP:
                continue
            out += differences(a.get(k), b.get(k), f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_analyze_of_a_run_s_report_gives_the_run_s_answer(tmp_path):
    from conftest import installed_nsys

    installed_nsys()
    script = ROOT / "programs" / "slow_loader_train.py"
    run = nvtx_trace("run", "--out", "r", "--no-history", str(script), "--steps", "400", cwd=tmp_path)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "after" in run.stderr and "warm-up steps" in run.stderr  # the default window left warm-up out
    # the report itself says where its window opened: one record, at the first captured step (SQL)
    with sqlite3.connect(tmp_path / "r" / "report.sqlite") as db:
        texts = [r[0] for r in db.execute("SELECT coalesce(s.value, e.text) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                                          "ON s.id = e.textId WHERE coalesce(s.value, e.text) LIKE "
                                          "'nvtx_autotrace.window %'")]
    assert len(texts) == 1
    first = json.loads(texts[0].split(" ", 1)[1])["first_step"]
    steps = summary["steps"]["summary"]
    assert steps["capture_first_step"] == first and steps["warmup_steps"] == 0
    assert summary["steps"]["table"][0]["step"] == first
    for door in ("r/report.sqlite", "r/report.nsys-rep"):
        nvtx_trace("analyze", door, "--json", "again.json", "--force", cwd=tmp_path)
        again = json.loads((tmp_path / "again.json").read_text())
        assert differences(summary, again) == [], door
    assert [f["kind"] for f in summary["findings"]][:1] == ["dataloader_stall"]  # a finding was compared too
