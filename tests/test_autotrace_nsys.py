"""End to end: ``python -m nvtx_autotrace programs/cpu_train.py`` under a real nsys
(NVTX + OS runtime, DataLoader workers forked), exported to SQLite and read back with
plain SQL. One profiled run, shared by every assertion."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import sqlite3
import sys
from collections import Counter, defaultdict

import pytest
from conftest import ROOT, again_after_nsys_fault, installed_nsys, need

from nvtx_trace import names

pytestmark = [pytest.mark.nsys, pytest.mark.torch, pytest.mark.slow]

SCRIPT = "programs/cpu_train.py"
STEPS = 6
LOADER = "cpu_train.py:68"  # the DataLoader(...) line in the script
RANGES_SQL = """
SELECT n.globalTid / 0x1000000 % 0x1000000 AS pid, n.globalTid % 0x1000000 AS tid, n.eventType,
       COALESCE(s.value, n.text) AS name, n.start, n."end"
FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
WHERE n.eventType IN (59, 60) ORDER BY n.start
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(rows, program stdout) of one profiled training run."""
    from nvtx_trace.capture import export
    from nvtx_trace.capture import profile as profiling

    need("PyTorch", importlib.util.find_spec("torch") is not None)
    found = installed_nsys()
    if found.year <= 2022:  # newer nvtx bindings are not recorded by the 2022.4 nsys
        need("nvtx==0.2.11 (for nsys 2022.x)", _nvtx_version() == "0.2.11")
    out = tmp_path_factory.mktemp("autotrace") / "cpu_train"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("NVTX_AUTOTRACE", None)
    env["NVTX_AUTOTRACE_BUDGET_PCT"] = "100"  # every depth fits: names of all depths can be checked
    result = again_after_nsys_fault(lambda: profiling.profile(
        found, [sys.executable, "-m", "nvtx_autotrace", SCRIPT, "--steps", str(STEPS), "--workers", "2",
                "--sample-ms", "2"],  # ~8 ms steps: at a 100 % budget every depth fits with a wide margin
        out, trace=["nvtx", "osrt"], extra=["-s", "none", "--cpuctxsw", "none", "--trace-fork-before-exec=true"],
        env=env, cwd=ROOT, capture_output=True,
    ))
    assert result.returncode == 0, result.log[-2000:]
    db = export.export_sqlite(found, result.require_report())
    con = sqlite3.connect(db)
    try:
        rows = con.execute(RANGES_SQL).fetchall()
    finally:
        con.close()
    _DB["path"] = db
    return rows, result.log


_DB: dict = {}
RANGED_STEPS = 3  # step 0 warm-up, steps 1-2 counted and timed: module ranges from step 3 on


def _nvtx_version() -> str | None:
    try:
        return importlib.metadata.version("nvtx")
    except importlib.metadata.PackageNotFoundError:
        return None


def _main_pid(rows) -> int:
    return Counter(r[0] for r in rows if r[3].startswith(names.STEP_PREFIX)).most_common(1)[0][0]


def test_losses_under_nsys_match_a_plain_run(run):
    sys.path.insert(0, str(ROOT / "programs"))
    import cpu_train

    _rows, log = run
    traced = re.findall(r"^loss (\d+) (\S+)$", log, re.MULTILINE)
    plain = cpu_train.train(steps=STEPS, workers=0)
    assert [h for _i, h in traced] == [x.hex() for x in plain]


def test_every_step_has_its_range_and_one_optimizer_step(run):
    rows, _log = run
    main = _main_pid(rows)
    steps = {r[3]: r for r in rows if r[0] == main and names.STEP_RE.match(r[3]) and r[2] == 60}
    opt = [r for r in rows if r[0] == main and r[3] == names.optimizer_step("SGD")]
    assert len(opt) == STEPS
    for k in range(STEPS):
        s = steps[names.step(k)]
        inside = [o for o in opt if s[4] <= o[4] and o[5] <= s[5]]
        assert len(inside) == 1, f"step {k}"
        assert s[5] >= inside[0][5]  # the step ends when its optimizer step does
        if k not in (0, 1, RANGED_STEPS):  # models are looked up before step 1, costs measured before step 3
            # back to back: only the boundary callbacks run between them (< 1 ms even on a loaded 2-core VM)
            assert s[4] == pytest.approx(steps[names.step(k - 1)][5], abs=1_000_000)
    # between steps 2 and 3 the instrumentation measured its own costs (and says so in one range)
    record = next(r for r in rows if r[0] == main and r[3].startswith(names.INSTRUMENTATION_PREFIX))
    assert steps[names.step(2)][5] <= record[4] and record[5] <= steps[names.step(3)][4]


def test_batch_waits_are_on_the_training_thread(run):
    rows, _log = run
    main = _main_pid(rows)
    waits = [r for r in rows if r[3] == names.loader_wait(LOADER)]
    assert len(waits) >= STEPS and {r[0] for r in waits} == {main}


def test_each_worker_fetches_under_its_own_pid(run):
    rows, _log = run
    main = _main_pid(rows)
    fetches = defaultdict(set)
    for r in rows:
        if names.WORKER_FETCH_RE.match(r[3]):
            fetches[r[0]].add(r[3])
    assert main not in fetches
    assert sorted(fetches.values(), key=sorted) == [{names.worker_fetch(LOADER, 0)}, {names.worker_fetch(LOADER, 1)}]
    # each batch once; a worker's last range may be lost as the loader ends it (test_run.py sees that too)
    per_worker = Counter(r[0] for r in rows if names.WORKER_FETCH_RE.match(r[3]))
    assert sum(per_worker.values()) <= STEPS and all(n >= STEPS // 2 - 1 for n in per_worker.values()), per_worker


def test_module_forwards_backwards_and_zero_grad_are_named(run):
    rows, _log = run
    main = _main_pid(rows)
    counts = Counter(r[3] for r in rows if r[0] == main)
    for name in ("forward (TinyNet)", "forward stem (Linear)", "forward blocks (Sequential)",
                 "forward blocks.0 (Block)", "forward blocks.1.fc2 (Linear)", "forward head (Linear)",
                 "backward (TinyNet)", "backward blocks.0.fc1 (Linear)"):
        assert counts[name] == RANGED_STEPS, name
    for name in (names.BACKWARD, names.zero_grad("SGD")):
        assert counts[name] == STEPS, name
    forwards = [r for r in rows if r[0] == main and r[2] == 59 and r[3].startswith(names.FORWARD_PREFIX)]
    root = next(r for r in forwards if r[3] == "forward (TinyNet)")
    child = next(r for r in forwards if r[3] == "forward blocks.0.fc1 (Linear)")
    assert root[4] <= child[4] and child[5] <= root[5]  # nested in time on one thread


def test_instrumentation_record_precedes_every_module_range(run):
    rows, _log = run
    main = _main_pid(rows)
    records = [r for r in rows if r[0] == main and r[3].startswith(names.INSTRUMENTATION_PREFIX)]
    assert len(records) == 1
    record = json.loads(records[0][3][len(names.INSTRUMENTATION_PREFIX):])
    assert record["forward_depth"] == record["max_depth"] == 3 and record["backward_depth"] == 3
    assert record["module_forward_ns"] > 0 and record["module_backward_ns"] > 0 and record["range_ns"] > 0
    modules = [r for r in rows if r[0] == main and names.MODULE_RE.match(r[3])]
    assert modules and min(r[4] for r in modules) > records[0][4]


def test_analyzer_cost_is_the_recorded_unit_costs_times_the_ranges_sql_counts(run):
    """summary.json `instrumentation` against an independent count of the same ranges in plain SQL."""
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.analyzer.summary import to_dict

    rows, _log = run
    out = to_dict(analyze(_DB["path"]))
    inst, window, steady = out["instrumentation"], out["window"], out["steps"]["summary"]["steady_steps"]
    assert set(inst) == {"ranges_per_step", "cost_ns_per_step", "method", "settings"}
    assert out["profiler"] is None  # a whole-run capture: no steps ran outside it
    main = _main_pid(rows)
    own = [r for r in rows if r[0] == main and window["start_ns"] <= r[4] < window["end_ns"]
           and names.is_auto_range(r[3]) and not r[3].startswith((names.INSTRUMENTATION_PREFIX, names.CALIBRATION))]
    fwd = sum(1 for r in own if r[3].startswith(names.FORWARD_PREFIX))
    bwd = sum(1 for r in own if r[3].startswith(names.BACKWARD_PREFIX))
    units = inst["settings"]
    expected = (fwd * units["module_forward_ns"] + bwd * units["module_backward_ns"]
                + (len(own) - fwd - bwd) * units["range_ns"]) / steady
    assert fwd and bwd
    assert inst["ranges_per_step"] == pytest.approx(len(own) / steady)
    assert inst["cost_ns_per_step"] == pytest.approx(expected)


def test_settings_record_under_nsys_says_what_the_program_set(run):
    """The settings record, read back with plain SQL, against what programs/cpu_train.py builds (checked
    independently here: its model's parameters counted by torch, its loader and optimizer as written)."""
    sys.path.insert(0, str(ROOT / "programs"))
    from cpu_train import TinyNet

    from nvtx_trace.analyzer import analyze
    from nvtx_trace.analyzer.summary import to_dict

    rows, _log = run
    main = _main_pid(rows)
    records = [json.loads(r[3][len(names.SETTINGS_PREFIX):]) for r in rows
               if r[0] == main and r[3].startswith(names.SETTINGS_PREFIX)]
    assert len(records) == 2  # step 1 (read), step 2 (zero_grad seen); no window: nothing more
    assert not any(r[3].startswith(names.SETTINGS_PREFIX) for r in rows if r[0] != main)  # not in workers
    first, last = records
    assert first["zero_grad_set_to_none"] is None and last["zero_grad_set_to_none"] is True
    params = sum(p.numel() for p in TinyNet().parameters())
    assert last["parameter_dtypes"] == {"float32": params}
    tensors = len(list(TinyNet().parameters()))
    assert last["optimizers"] == [{"class": "SGD", "module": "torch.optim.sgd", "foreach": None, "fused": None,
                                   "params": tensors, "trained_elements": params}]
    assert last["empty_cache_per_step"] == 0 and first["empty_cache_per_step"] is None  # counted from step 1
    assert isinstance(first["scan_ns"], int) and first["scan_ns"] > 0
    assert last["dataloaders"] == [{"loader": LOADER, "batch_size": 8, "num_workers": 2, "pin_memory": False,
                                    "persistent_workers": False, "prefetch_factor": 2}]
    assert last["autocast"] == [] and last["wrappers"] == [] and last["compiled_modules"] == 0
    assert last["device"] is None and last["conv_bias_before_bn"] == {"count": 0, "examples": []}
    assert last["anomaly_detection"] is False
    assert last["torch"] == __import__("torch").__version__
    assert to_dict(analyze(_DB["path"]))["settings"] == last
