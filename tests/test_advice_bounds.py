"""Advice never exceeds the machine the report was captured on: worker counts fit its CPU cores."""

from __future__ import annotations

import re
import shutil
import sqlite3

import pytest
from conftest import ROOT, sample_analysis

from nvtx_trace.analyzer import analyze

SAMPLES = ROOT / "sample_reports"


def with_cores(name: str, cores: int, tmp_path):
    copy = tmp_path / f"{name}.{cores}cores.sqlite"
    shutil.copy(SAMPLES / f"{name}.sqlite", copy)
    with sqlite3.connect(copy) as db:
        assert db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'CpuCores'", (str(cores),)).rowcount
    return copy


def advised_workers(a) -> tuple[int | None, int]:
    stall = next(f for f in a.findings if f.kind == "dataloader_stall")
    have = int(a.loader.loaders.sort_values("wait_ns", ascending=False).iloc[0]["workers"])
    m = re.search(r"num_workers=(\d+)", stall.fix)
    return (int(m.group(1)) if m else None), have


@pytest.mark.parametrize("name", ["cpu_slow_loader", "resnet_ddp_flawed"])
def test_worker_advice_fits_the_cores_in_the_report(name):
    a = sample_analysis(SAMPLES / f"{name}.sqlite")
    (cores,) = sqlite3.connect(SAMPLES / f"{name}.sqlite").execute(
        "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'CpuCores'").fetchone()  # independent of the reader
    ranks = a.loader.waits["pid"].nunique()
    advised, have = advised_workers(a)
    assert a.cpu_cores == int(cores)
    assert advised is None or advised <= max(have, int(cores) // ranks - 1)


def test_fewer_cores_bound_the_advice_and_more_cores_free_it(tmp_path):
    need_line = re.compile(r"num_workers=(\d+) \(now (\d+)\)")
    few = analyze(with_cores("resnet_ddp_flawed", 4, tmp_path))  # 2 ranks: one worker each at most
    advised, have = advised_workers(few)
    assert advised is None or advised <= max(have, 4 // 2 - 1)
    stall = next(f for f in few.findings if f.kind == "dataloader_stall")
    assert "4 CPU cores for 2 training processes" in stall.fix and "cheaper to load" in stall.fix
    many = analyze(with_cores("resnet_ddp_flawed", 64, tmp_path))
    stall = next(f for f in many.findings if f.kind == "dataloader_stall")
    assert need_line.search(stall.fix) and "CPU cores" not in stall.fix  # nothing to bound


def test_loader_prediction_is_never_faster_than_the_measured_compute():
    """predicted.step_ns against an independent SQL computation of the compute time per step
    (step range minus the batch waits inside it, median over the steady steps)."""
    a = sample_analysis(SAMPLES / "resnet_flawed.sqlite")
    stall = next(f for f in a.findings if f.kind == "dataloader_stall")
    with sqlite3.connect(SAMPLES / "resnet_flawed.sqlite") as db:
        rows = db.execute("""
            SELECT s.start, s.end, (SELECT coalesce(sum(w.end - w.start), 0) FROM NVTX_EVENTS w
                                    JOIN StringIds ws ON ws.id = w.textId
                                    WHERE ws.value GLOB 'dataloader.next *' AND w.start >= s.start AND w.end <= s.end
                                      AND w.globalTid = s.globalTid)
            FROM NVTX_EVENTS s JOIN StringIds ss ON ss.id = s.textId
            WHERE ss.value GLOB 'step [0-9]*' ORDER BY s.start""").fetchall()
    steady = rows[a.steps.warmup_steps:len(a.steps.table)]
    compute = sorted(end - start - wait for start, end, wait in steady)[len(steady) // 2]
    p = stall.predicted
    assert p["step_ns"] >= 0.98 * compute  # never faster than the GPU/CPU work the step itself needs
    assert p["step_ns"] + p["saving_ns"] == pytest.approx(a.steps.summary()["step_ns_median"], abs=1)
    assert stall.recommend["num_workers"] <= a.cpu_cores - 1 and stall.recommend["pin_memory"] is True
    assert "Expected with num_workers=4 alone: step" in stall.fix and stall.predicted["for"] == "num_workers=4"
