"""`nvtx-trace tune`: profile, try the finding that promises most, keep it only if it holds, profile again.

The decisions (which finding, kept or not) are checked on rounds of known step times; the whole loop on a real
program under the real nsys: a CPU loop whose two workers wait 10 ms for each sample (I/O: no core needed), so
more workers must make it at least 2x faster, a bound the program sets (4 samples a batch: 40 ms a batch, 20 ms
a step with two workers, against a step of about 3 ms of its own work).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT, knob_records

from nvtx_trace.runner import timing, tune, tune_stages, tune_trial
from nvtx_trace.runner.timing import Round, Variant


def cli(*args: str, cwd=ROOT, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "tune", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def finding(kind, step_ms, recommend, statistic="median"):
    return {"kind": kind, "impact_ns": 1, "recommend": recommend,
            "predicted": {"step_ns": int(step_ms * 1e6), "statistic": statistic}}


def profile(*findings, step_ms=100.0, own_ns=0):
    return {"steps": {"summary": {"steps": 50, "step_ns_median": int(step_ms * 1e6), "step_ns_mean": int(step_ms * 1e6),
                                  "statistic": "median"}},
            "instrumentation": {"cost_ns_per_step": own_ns}, "findings": list(findings)}


def test_a_finding_without_a_prediction_is_tried_after_every_predicted_one_through_the_program_s_option():
    """Issue 51: hand-written attention predicts nothing, and only the program's own option fixes it; with
    --flash in the script it is a candidate, after the predicted ones (largest impact first), and never before."""
    from nvtx_trace.runner import program_options

    attention = {"kind": "manual_attention", "impact_ns": 5e8, "recommend": {"sdpa": True}, "predicted": None}
    layout = {"kind": "layout_transpose", "impact_ns": 1e8, "recommend": None, "predicted": None}
    p = profile(attention, layout, finding("fusion", 80, {"compile": True}))
    flash = program_options.levers([program_options.Option(("--flash",), "value", "int", 0)])
    assert [c.knobs for c in tune_trial.candidates(p, {}, [], levers=flash)] == [
        {"compile": True}, {"sdpa": True}, {"channels_last": True}]
    assert [c.knobs for c in tune_trial.candidates(p, {}, [])] == [{"compile": True}, {"channels_last": True}]
    assert tune_trial.candidates(p, {}, [], levers=flash)[1].predicted_step_ms is None


def test_precision_is_tried_a_step_at_a_time_and_amp_fp16_never():
    fp32 = finding("precision", 40, {"tf32": True, "amp": "bf16"})
    assert tune_trial.next_knobs(fp32, {}) == {"tf32": True}
    assert tune_trial.next_knobs(fp32, {"tf32": True}) == {"amp": "bf16"}  # TF32 kept: bf16 is its next step
    assert tune_trial.next_knobs(finding("precision", 40, {"amp": "fp16"}), {}) == {}
    assert tune_trial.next_knobs({"kind": "layout_transpose", "recommend": None}, {}) == {"channels_last": True}
    assert tune_trial.next_knobs(finding("manual_attention", 40, {"sdpa": True}), {}) == {}  # no knob applies


def test_the_largest_predicted_saving_goes_first_and_small_or_rejected_ones_never():
    p = profile(finding("fusion", 90, {"compile": True}), finding("precision", 50, {"tf32": True, "amp": "bf16"}),
                finding("optimizer", 98, {"fused_optimizer": True}), finding("sync", 10, None),
                finding("dataloader_stall", 60, {"num_workers": 8}), step_ms=100.0, own_ns=int(2e6))
    got = tune_trial.candidates(p, {}, [])
    # predictions less the tool's own cost (2 ms): 48, 58, 88 (of 98); 96 is 2 % of 98: not worth a trial
    assert [c.knobs for c in got] == [{"tf32": True}, {"num_workers": 8}, {"compile": True}]
    assert got[0].predicted_step_ms == pytest.approx(48.0) and got[0].profile_step_ms == pytest.approx(98.0)
    # a knob rejected once is not tried again, whatever value a later profile proposes
    assert [c.knobs for c in tune_trial.candidates(p, {}, [{"num_workers": 4}, {"tf32": True}])] == [{"compile": True}]
    left = tune_trial.remaining(p)
    assert [r["kind"] for r in left] == ["sync"] and left[0]["saving_fraction"] == pytest.approx(1 - 8 / 98, abs=1e-3)


def rounds(*steps, losses=(1.0, 0.9, 0.8), knobs=("tf32", "compile", "amp", "pin_memory")):
    said = knob_records(*(f"{k}=1: applied" for k in knobs if k != "amp"), "amp=bf16: applied")  # each reached it
    return [Round([s], "median", s, said, 0, losses=list(losses)) for s in steps]


@pytest.mark.parametrize("base, variant, knobs, kept, why", [
    ((100, 100), (50, 52), {"tf32": True}, True, "faster, every round"),
    ((100, 100), (98, 98), {"tf32": True}, False, "less than 3% faster"),
    ((100, 60), (70, 70), {"compile": True}, False, "within the spread of the rounds"),
    # beside a CPU burner and another nsys (issue 52): every round faster, 1.17x, but the knob's own rounds 3 ms apart
    ((11.92, 12.02), (8.71, 11.74), {"prefetch_factor": 4}, False, "differ by 3.03 ms, as much as the 1.74 ms"),
    ((36.85, 37.09), (34.87, 33.89), {"tf32": True}, True, "faster, every round"),  # H200: 1 ms apart, 2.6 saved
])
def test_a_knob_is_kept_only_when_every_round_is_faster_by_3_percent(base, variant, knobs, kept, why):
    b, v = Variant({}, rounds(*base), added={}), Variant(knobs, rounds(*variant, knobs=tuple(knobs)), added=knobs)
    got = tune_trial.judge(b, v)
    assert got["kept"] is kept and why in got["why"], got


def test_losses_must_agree_within_the_knob_s_bound_beyond_the_baseline_s_own_noise():
    b = Variant({}, rounds(100, 100, losses=(2.0, 1.9)), added={})
    moved = rounds(50, 50, losses=(2.0, 1.9 * 1.01))  # 1 %: within bf16's 2 %, beyond exact loader knobs
    assert tune_trial.judge(b, Variant({"amp": "bf16"}, moved, added={"amp": "bf16"}))["kept"]
    got = tune_trial.judge(b, Variant({"pin_memory": True}, moved, added={"pin_memory": True}))
    assert not got["kept"] and "losses moved 1.00%" in got["why"]
    nan = rounds(50, 50, losses=(2.0, float("nan")))
    assert not tune_trial.judge(b, Variant({"tf32": True}, nan, added={"tf32": True}))["kept"]


def test_a_trial_stops_once_its_verdict_cannot_change():
    """Issue 51: a round with the knob no faster than one without already rejects it (judge wants every round
    faster); so does a failed run. Until then the rounds go on."""
    b = Variant({}, rounds(100), added={})
    assert tune_trial.settled([b, Variant({"tf32": True}, rounds(101), added={"tf32": True})]).endswith("rejected")
    assert tune_trial.settled([b, Variant({"tf32": True}, rounds(90), added={"tf32": True})]) is None  # 10 %: go on
    assert "clear" in tune_trial.settled([b, Variant({"tf32": True}, rounds(60), added={"tf32": True})])  # 40 %: done
    two = Variant({"tf32": True}, rounds(60, 61), added={"tf32": True})
    assert tune_trial.settled([Variant({}, rounds(100, 100), added={}), two]) is None  # the rounds went on: judge decides
    failed = Variant({"tf32": True}, [Round([], "median", None, knob_records("tf32=1: set"), 1, "boom")],
                     added={"tf32": True})
    assert "failed" in tune_trial.settled([b, failed])


def test_a_first_round_is_a_clear_win_only_in_each_half_of_its_steps():
    """Issue 52: beside a CPU burner and another nsys the steps ran 8 or 12 ms as the other load came and went; a
    knob's first round whose second half fell in a quiet spell measured 19 % faster than a baseline round all in a
    busy one and was kept on that one round (tune kept prefetch_factor=4 in a program that needs nothing). Its
    halves (11.33 and 8.07 ms against 12.00 and 11.99) say the win is the machine's: the second round runs."""
    def steps(*halves, n=20):
        return [h for h in halves for _ in range(n)]
    knob = {"prefetch_factor": 4}
    b = Variant({}, [Round(steps(12.00, 11.99), "median", 12.0, [], 0)], added={})
    drifted = Variant(knob, [Round(steps(11.33, 8.07), "median", 9.7, knob_records("prefetch_factor=4: set"), 0)],
                      added=knob)
    assert drifted.per_round("median") == [pytest.approx(9.70)]  # 19 % faster as one value
    assert tune_trial.settled([b, drifted]) is None
    steady = Variant(knob, [Round(steps(8.10, 8.07), "median", 8.08, knob_records("prefetch_factor=4: set"), 0)],
                     added=knob)
    assert "clear" in tune_trial.settled([b, steady])


def test_a_first_round_is_a_clear_win_only_against_the_profile_s_pace_too():
    """Issue 52: beside a CPU burner and another nsys, a loaded pass's tune kept prefetch_factor=4 (a program that
    needs nothing) on one round: the baseline's all in a busy spell (15.97 ms, both halves), the knob's in a quieter
    one (12.08 ms), where the baseline configuration's own profile, under the tool, had run 9.75 ms. That third
    sample says the win is the machine's: the second round runs. A real win (8.1 ms) stays clear against it."""
    def one_round(ms, knob):
        return [Round([ms] * 40, "median", ms, knob_records(*[f"{k}={v}: set" for k, v in knob.items()]), 0)]
    knob = {"prefetch_factor": 4}
    b = Variant({}, one_round(15.97, {}), added={})
    busy_then_quiet = Variant(knob, one_round(12.08, knob), added=knob)
    assert "clear" in tune_trial.settled([b, busy_then_quiet])  # without the profile: as it was
    profiled = {"median": 9.75, "mean": 9.90}
    assert tune_trial.settled([b, busy_then_quiet], profiled) is None
    real = Variant(knob, one_round(8.10, knob), added=knob)
    assert "clear" in tune_trial.settled([b, real], profiled)
    assert "clear" in tune_trial.settled([b, real], {"median": None, "mean": None})  # no figure: halves decide


def test_a_clear_first_round_whose_losses_moved_waits_for_the_baseline_s_own_noise():
    """An H200 image-folder classifier (unseeded: random initialisation, shuffle): `--workers 7` ran 2.33x faster
    on its first round and was rejected for its first losses 25 % apart, beyond num_workers' 5 %, with the
    baseline's own run-to-run difference unknown (one round). Such a round is no settled verdict: the next
    round measures that difference. Losses within the bound still settle it on one round."""
    workers = {"num_workers": 7}
    b = Variant({}, rounds(92.4, losses=(2.40, 2.35, 2.30)), added={})
    moved = Variant(workers, rounds(39.6, losses=(3.00, 2.35, 2.30), knobs=()), added=workers)
    assert tune_trial.settled([b, moved]) is None
    same = Variant(workers, rounds(39.6, losses=(2.40, 2.36, 2.30), knobs=()), added=workers)
    assert "clear" in tune_trial.settled([b, same])
    b2 = Variant({}, rounds(92.4, 93.0, losses=(2.40, 2.35, 2.30)), added={})  # its noise known: judge decides
    assert "clear" in tune_trial.settled([b2, Variant(workers, moved.rounds, added=workers)])


def test_a_knob_that_changed_nothing_or_crashed_is_rejected_with_its_reason():
    b = Variant({}, rounds(100, 100), added={})
    inert = Variant({"compile": True}, [Round([50.0], "median", 50.0, knob_records("compile=1: not applied: compiled"), 0)],
                    added={"compile": True})
    assert "changed nothing" in tune_trial.judge(b, inert)["why"]
    crashed = Variant({"tf32": True}, [Round([], "median", None, knob_records("tf32=1: set"), 1, "the program exited with "
                                             "status 1: boom (its output: x/round-1.log)")], added={"tf32": True})
    got = tune_trial.judge(b, crashed)
    assert not got["kept"] and "a run failed" in got["why"] and "round-1.log" in got["why"]


def documented(section: str) -> dict[str, set[str]]:
    """The keys each table of docs/json-schema.md's tune section names, by the table's heading word."""
    doc = (ROOT / "docs" / "json-schema.md").read_text().split("## `nvtx-trace tune`", 1)[1].split("\n## ", 1)[0]
    out, name = {}, None
    for line in doc.splitlines():
        head = re.match(r"^([\w.\[\]]+) keys\b", line)
        if head:
            name = head.group(1)
            out[name] = set()
        elif name and line.startswith("| `"):
            out[name] |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    return out


def test_tune_json_keys_are_the_documented_contract(tmp_path):
    """The keys the issue named are all there, and every key tune.json carries is documented."""
    t = tune_stages.Tuner(["train.py"], tmp_path)
    t.stages = [{"stage": 1, "profile_step_ms": 10.0, "knobs": None, "kept": False}]
    keys = documented("tune")
    d = t.result()
    named = {"baseline_step_ms", "final_step_ms", "speedup", "kept_knobs", "stages", "remaining", "permanent", "flops"}
    assert named <= set(d) and set(d) == keys["tune.json"]
    stage_named = {"profile", "knobs", "finding", "predicted_step_ms", "measured_step_ms", "kept", "why"}
    assert stage_named <= keys["stages[]"]
    assert {"knob", "value", "framework", "lines", "script_flag", "through_option"} == keys["permanent[]"]
    assert {"flag", "kind", "default", "maps_to", "values_tried", "kept", "failed"} == keys["options[]"]
    assert {"kind", "title", "fix", "impact_ms", "predicted_step_ms", "saving_fraction", "where"} == keys["remaining[]"]
    t.first_settings = {"model_flops_per_step": 6e12, "flops_step": 2, "device": {"name": "NVIDIA H100 80GB HBM3"},
                        "matmul_allow_tf32": False}
    t.stages = [{"stage": 1, "configuration": {}, "knobs": {"tf32": True}, "kept": True, "measured_step_ms": 50.0}]
    flops = t._flops(100.0)
    assert set(flops) == keys["flops"] - {"label", "step_ms", "tflops", "precision", "peak_tflops", "peak_fraction"}
    # 6 TFLOP a step: 60 TFLOP/s at 100 ms in fp32 (of 66.9), 120 at 50 ms with TF32 (of 494.7)
    assert [(r["label"], r["tflops"], r["precision"], r["peak_fraction"]) for r in flops["stages"]] == [
        ("as it is", 60.0, "fp32", round(60 / 66.9, 4)), ("tf32=1", 120.0, "tf32", round(120 / 494.7, 4))]
    assert set(flops["stages"][0]) == {"label", "step_ms", "tflops", "precision", "peak_tflops", "peak_fraction"}


def test_permanent_lines_follow_the_framework_and_the_script_s_own_flags(tmp_path):
    from nvtx_trace.runner import permanent

    script = tmp_path / "train.py"
    script.write_text("p.add_argument('--compile', action='store_true')\np.add_argument('-j', '--workers', type=int)\n")
    from nvtx_trace.runner import program_options

    levers = program_options.levers(program_options.read(script))
    plain = {p["knob"]: p for p in permanent.lines({"compile": True, "num_workers": 8, "tf32": True},
                                                    {"framework": {"name": "pytorch"}}, levers)}
    assert plain["compile"]["script_flag"] == "--compile" and plain["num_workers"]["script_flag"] == "--workers 8"
    assert plain["tf32"]["lines"][0] == "torch.backends.cuda.matmul.allow_tf32 = True"
    hf = permanent.lines({"amp": "bf16", "num_workers": 4}, {"framework": {"name": "hf_trainer"}}, levers)
    assert [p["lines"] for p in hf] == [["TrainingArguments(..., bf16=True)"],
                                        ["TrainingArguments(..., dataloader_num_workers=4)"]]
    lightning = permanent.lines({"amp": "bf16"}, {"framework": {"name": "lightning"}}, levers)
    assert lightning[0]["lines"] == ['Trainer(..., precision="bf16-mixed")']


@pytest.mark.parametrize("args, says", [
    (["--budget", "10", "programs/cpu_train.py"], "--budget 10 s cannot pay for one stage"),
    (["--budget", "inf", "programs/cpu_train.py"], "--budget inf: give a number of seconds"),
    (["--budget", "1e400", "programs/cpu_train.py"], "--budget inf: give a number of seconds"),
    (["--budget", "nan", "programs/cpu_train.py"], "--budget nan: give a number of seconds"),
    (["--rounds", "1000000", "programs/cpu_train.py"], "--rounds 1000000: a trial is 2000000 plain runs"),
    (["missing.py"], "missing.py: no such file"),
    (["--", "torchrun", "--nproc_per_node=2", "--no-python", "echo"], "not --no-python"),
    (["--", "torchrun", "--nproc_per_node=2", "missing.py"], "missing.py: no such file"),
    (["--rounds", "0", "programs/cpu_train.py"], "--rounds must be at least 1"),
])
def test_bad_requests_are_one_line_and_a_nonzero_exit(args, says, tmp_path):
    proc = cli("--out", str(tmp_path / "t"), *args, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "t").exists()


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_script_with_no_training_steps_is_one_line_and_nothing_is_left_running(tmp_path):
    from conftest import installed_nsys

    installed_nsys()
    proc = cli("--no-history", "--out", str(tmp_path / "t"), "programs/no_step_loop.py", "--seconds", "8",
               timeout=300)
    assert proc.returncode != 0 and "the profile found no training steps" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not _left_running("no_step_loop.py")


_ALIVE_BEFORE: dict[str, set[int]] = {}


@pytest.fixture
def alive_before():
    """The processes of each program name alive as a test starts (another test's, killed late by a scheduler, is
    not this test's to judge: issue 52, item 20)."""
    _ALIVE_BEFORE.clear()
    for name in ("slow_loader_train.py", "ddp_gloo_cpu_train.py"):
        _ALIVE_BEFORE[name] = set(_running(name))
    yield


def _left_running(name: str) -> list[int]:
    """This test's processes of ``name`` still alive."""
    return [p for p in _running(name) if p not in _ALIVE_BEFORE.get(name, ())]


def _running(name: str) -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if name.encode() in fh.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_loader_bound_loop_tunes_to_2x_with_more_workers_kept_and_the_script_untouched(tmp_path, alive_before):
    """The real nsys and plain runs: the profile sizes the workers by the CPU they use (1 % of each fetch: they
    sleep), the trial keeps the count, every stage is a history row, nothing is left running, the script's bytes
    never change. The 2x bound comes from the program (two workers deliver a batch every 20 ms; its own step
    work is 2 ms), not from the tool's figures."""
    from conftest import installed_nsys

    installed_nsys()
    script = ROOT / "programs" / "slow_loader_train.py"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    db = tmp_path / "h.db"
    proc = cli("--budget", "600", "--out", str(tmp_path / "t"), "--json", str(tmp_path / "tune.json"),
               "--history", str(db), str(script), "--sleep-fetch", "--workers", "2", "--work-ms", "10", "--batch", "4",
               "--step-ms", "2", "--steps", "4000", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "tune.json").read_text())
    assert d["speedup"] >= 2.0 and d["kept_knobs"].get("num_workers", 2) > 2, d
    first = d["stages"][0]
    assert first["finding"] == "dataloader_stall" and first["kept"] and first["configuration"] == {}
    assert first["loss_max_rel_diff"] == 0.0  # sample i depends on i alone: the same losses with more workers
    # the figures in the table are the rounds' own: the measured step is the median of the variant's rounds
    assert first["measured_step_ms"] == pytest.approx(statistics.median(first["rounds_ms"]["variant"]))
    assert d["stopped"] in ("nothing left", "budget") and (tmp_path / "t" / "tune.html").is_file()
    assert d["permanent"][0]["knob"] == "num_workers" and d["permanent"][0]["script_flag"].startswith("--workers ")
    # model FLOPs of one step, counted in the first profile's warm-up: Linear(8, 16), ReLU, Linear(16, 4) on 4
    # samples: forward 2*4*8*16 + 2*4*16*4 = 1536, backward the weights' two and the hidden input's one, 2048
    assert d["flops"]["per_step"] == 3584 and d["flops"]["device"] is None
    assert "<svg" in (tmp_path / "t" / "tune.html").read_text()  # the step per stage, drawn
    shown = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "analyze", d["stages"][0]["profile"] +
                            "/report.sqlite"], capture_output=True, text=True, cwd=ROOT, timeout=300).stdout
    assert "Model FLOPs: 3.58e-09 TFLOP a step (counted in warm-up step 2)" in shown
    assert json.loads((tmp_path / "t" / "tune.json").read_text()) == d
    runs = json.loads(subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "history", "--json", "--history",
                                      str(db)], capture_output=True, text=True, cwd=ROOT).stdout)["runs"]
    tried = [s for s in d["stages"] if s["knobs"]]
    assert [r["kind"] for r in runs] == ["tune"] * len(tried)
    assert sorted(r["try_verdict"] for r in runs) == sorted("kept" if s["kept"] else "rejected" for s in tried)
    assert "To keep them" in proc.stdout and "stage 1" in proc.stderr and "left)" in proc.stderr
    assert hashlib.sha256(script.read_bytes()).hexdigest() == digest
    assert not _left_running("slow_loader_train.py")


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_program_with_nothing_to_fix_gets_one_profile_and_keeps_nothing(tmp_path):
    """Two workers for a loader that needs far less: its finding names at most prefetch_factor (batches said to
    arrive in bursts; the loader's fix text names it, so tune tries it, issue 51), which a plain trial rejects;
    the one profile serves every stage (a rejected knob changes nothing to profile anew). Three rounds a side, as
    on any busy machine: beside a CPU burner and another nsys (issue 52) this program's steps run 8 or 12 ms as that
    load comes and goes, and two rounds a side kept prefetch_factor=4 in 1 of 8 tunes (2 of 4 before judge
    compared the saving with the rounds' own spread); three rounds a side kept it once more on one round, its
    baseline round in a busy spell (15.97 against 12.08 ms, the profile 9.75), before a first round had to be
    clear against the profile's pace too."""
    from conftest import installed_nsys

    installed_nsys()
    proc = cli("--no-history", "--rounds", "3", "--out", str(tmp_path / "t"), "programs/slow_loader_train.py",
               "--workers", "2",
               "--work-ms", "0.05", "--step-ms", "5", "--steps", "3000", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert d["stopped"] == "nothing left" and d["kept_knobs"] == {} and d["stages"][-1]["knobs"] is None
    assert [s["knobs"] for s in d["stages"][:-1]] in ([], [{"prefetch_factor": 4}])
    assert len({s["profile"] for s in d["stages"]}) == 1
    assert d["speedup"] == pytest.approx(1.0)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["stage-1", "tune.html", "tune.json"]


@pytest.mark.torch
def test_compile_reaches_the_model_inside_a_data_parallel_wrapper_and_amp_lightning_s_training_step(capsys):
    """compile=1 on a DataParallel compiles the model it wraps (the wrapper's own compile left the model eager:
    1.01x on one GPU); amp=bf16 wraps a LightningModule-shaped root's training_step, which computes the loss
    without calling self.forward."""
    torch = pytest.importorskip("torch")
    from nvtx_autotrace import knobs

    inner = torch.nn.Linear(4, 4)
    wrapped = torch.nn.DataParallel(inner)
    assert knobs._inside_wrapper(wrapped) is inner
    assert knobs._inside_wrapper(torch.nn.DataParallel(wrapped)) is inner and knobs._inside_wrapper(inner) is inner

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 4)

        def training_step(self, x):
            return self.net(x).dtype  # the loss side: a submodule, not self.forward

    root = Step()
    knobs._autocast(root, "Step", "bf16")
    assert root.training_step(torch.ones(2, 4)) == torch.bfloat16
    assert "Step.forward and .training_step run under torch.autocast" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_loader_bound_script_tunes_through_its_own_workers_option(tmp_path, alive_before):
    """Issue 51: the script's argparse has --workers (given 0 here); tune sets it on the command line (what the user
    keeps), not the DataLoader's argument: the trial's runs carry --workers N, the kept line is the command, >= 2x,
    the script's bytes unchanged. The bound is the program's (samples wait 10 ms each, 4 a batch: 40 ms in the loop
    with no worker; its own step work is 2 ms)."""
    from conftest import installed_nsys

    installed_nsys()
    script = ROOT / "programs" / "slow_loader_train.py"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()
    proc = cli("--no-history", "--budget", "600", "--out", str(tmp_path / "t"), str(script), "--sleep-fetch",
               "--workers", "0", "--work-ms", "10", "--batch", "4", "--step-ms", "2", "--steps", "4000", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    first = d["stages"][0]
    workers = first["knobs"]["num_workers"]
    assert first["kept"] and first["options"] == ["--workers", str(workers)], first
    assert d["speedup"] >= 2.0 and d["kept_knobs"]["num_workers"] >= 2
    kept = d["kept_knobs"]["num_workers"]
    assert d["command"][-2:] == ["--workers", str(kept)] and d["command"].count("--workers") == 1
    (line,) = [p for p in d["permanent"] if p["knob"] == "num_workers"]
    assert line["through_option"] and line["script_flag"] == f"--workers {kept}"
    (option,) = [o for o in d["options"] if o["flag"] == "--workers"]
    assert option["maps_to"] == "num_workers" and option["kept"] == kept and workers in option["values_tried"]
    # the trial's runs got the option, not the knob: no DataLoader override was said
    assert not any("nvtx-trace try: num_workers" in p.read_text() for p in (tmp_path / "t").rglob("round-*.log"))
    assert f"run it as: python {script}" in proc.stdout
    # where a plain run's time went: the parts add up to its wall time (each from the window's own notes)
    part = d["time"]["per_run"]
    assert part["window_s"] >= 3.0 and part["start_s"] > 0 and "a plain run (median): " in proc.stdout
    assert sum(part[k] for k in ("start_s", "warmup_s", "window_s", "end_s")) <= part["wall_s"] * 1.1 + 0.5
    assert hashlib.sha256(script.read_bytes()).hexdigest() == digest
    assert not _left_running("slow_loader_train.py")


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_ctrl_c_after_a_kept_stage_writes_what_was_kept_and_leaves_nothing_running(tmp_path, alive_before):
    """Ctrl-C while stage 2 profiles: exit 130, one line saying what was kept, tune.json with stage 1 and
    `stopped` "interrupted", nothing of the program or nsys left running."""
    from conftest import ctrl_c_when, installed_nsys

    installed_nsys()
    child = subprocess.Popen([sys.executable, "-m", "nvtx_trace.cli", "tune", "--no-history", "--out",
                              str(tmp_path / "t"), "programs/slow_loader_train.py", "--sleep-fetch", "--workers", "2",
                              "--work-ms", "10", "--batch", "4", "--step-ms", "2", "--steps", "4000"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    _, err = ctrl_c_when(child, "nvtx-trace tune: stage 2: profiling", timeout=120)
    assert child.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("nvtx-trace: interrupted (SIGINT)") and "kept so far: num_workers=" in last, last
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert d["stopped"] == "interrupted" and [s["kept"] for s in d["stages"]] == [True]
    assert d["kept_knobs"] == d["stages"][0]["knobs"] and "Traceback" not in err
    assert not _left_running("slow_loader_train.py")


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_torchrun_job_is_tuned_rank_by_rank_and_its_script_s_flag_named(tmp_path, alive_before):
    """`tune -- torchrun --nproc_per_node=2`: the profile is run's of the whole job, each plain run starts
    nvtx_autotrace in every rank (rank 0's steps timed), and the DDP ranks' loaders (one worker each, samples
    waiting 10 ms: 40 ms a batch) get more workers: at least 2x, the bound the program sets."""
    from conftest import installed_nsys

    installed_nsys()
    proc = cli("--no-history", "--budget", "600", "--out", str(tmp_path / "t"), "--", "torchrun", "--nproc_per_node=2",
               "programs/ddp_gloo_cpu_train.py", "--sleep-fetch", "--work-ms", "10", "--steps", "400", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert d["speedup"] >= 2.0 and d["kept_knobs"].get("num_workers", 1) > 1, d
    assert d["permanent"][0]["script_flag"] == f"--workers {d['kept_knobs']['num_workers']}"
    assert not _left_running("ddp_gloo_cpu_train.py")


def test_compile_takes_a_mode_and_the_launch_bound_finding_recommends_cuda_graphs():
    """compile=reduce-overhead (CUDA graphs) is a knob of its own value; a launch-bound cpu_overhead finding
    recommends it unless the program captures graphs already, so tune and try --advice measure it."""
    from types import SimpleNamespace

    from nvtx_trace import knobs as declared
    from nvtx_trace.analyzer.questions.cpu_bound import _cuda_graphs

    assert declared.parse("compile=reduce-overhead") == {"compile": "reduce-overhead"}
    assert declared.text({"compile": "max-autotune", "tf32": True}) == "compile=max-autotune,tf32=1"
    with pytest.raises(ValueError, match="or a mode"):
        declared.parse("compile=fast")
    assert _cuda_graphs(SimpleNamespace(settings={"cuda_graphs": 0})) == {"compile": "reduce-overhead"}
    assert _cuda_graphs(SimpleNamespace(settings={"cuda_graphs": 2})) is None
    # kept compile=1, a later profile's launch-bound finding: the mode is the next thing to try
    assert tune_trial.next_knobs({"kind": "cpu_overhead", "recommend": {"compile": "reduce-overhead"}},
                           {"compile": True}) == {"compile": "reduce-overhead"}


@pytest.mark.torch
def test_no_data_parallel_leaves_a_wrapper_without_one_gpu_as_it_is_and_says_why(capsys):
    torch = pytest.importorskip("torch")
    from nvtx_autotrace import _registry, knobs

    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))  # no GPU here: it drives none
    knobs.install({"no_data_parallel": True})
    try:
        out = model(torch.ones(1, 2))
    finally:
        _registry.undo_all()
    assert out.shape == (1, 2)
    assert "no_data_parallel=1: not applied to DataParallel (Linear): it drives no GPU" in capsys.readouterr().err


def test_when_the_budget_ends_after_a_kept_knob_what_is_left_comes_from_a_profile_of_the_tuned_program(
        tmp_path, monkeypatch):
    """Issue 51, item 5: remaining[] came from the profile before the last kept knob (the HF run's "alignment, 26 %
    less" was measured before compile). A profile of the tuned program is reserved from the budget and made; a
    clock of our own: a profile takes 30 s, a plain run 10 s."""
    now = [0.0]
    profiled = []

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += 30
        out.mkdir(parents=True, exist_ok=True)
        kind = "dataloader_stall" if not knobs and not profiled else "sync"
        f = finding(kind, 50, {"num_workers": 8} if kind == "dataloader_stall" else None)
        (out / "summary.json").write_text(json.dumps(profile(f, step_ms=100.0)))
        profiled.append(out)
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        for v in variants:
            now[0] += 10
            ms = 100.0 if not v.added else 50.0
            v.rounds.append(Round([ms] * 20, "median", ms, knob_records("num_workers=8: DataLoader created"), 0))
        return variants

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    t = tune_stages.Tuner(["train.py"], tmp_path, budget_s=150, clock=lambda: now[0], say=lambda m: None)
    d = t.run()
    assert d["kept_knobs"] == {"num_workers": 8} and d["stopped"] == "budget"
    assert [p.parent.name for p in profiled] == ["stage-1", "final"]
    assert d["remaining_from"]["configuration"] == {"num_workers": 8} and [r["kind"] for r in d["remaining"]] == ["sync"]
    assert d["elapsed_s"] <= 150


def test_an_option_whose_trial_fails_is_tried_again_as_the_knob(tmp_path, monkeypatch):
    """Seen on an H200: an HfArgumentParser script refused `--tf32` without its value (exit 2), and tf32 was then
    never tried. A program refusing or crashing on its own option is no verdict on the knob: it is tried as
    nvtx_autotrace applies it, and the option is said to have failed."""
    from nvtx_trace.runner import program_options

    script = tmp_path / "train.py"
    script.write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--tensorcores', type=int, "
                      "default=0)\n")
    now = [0.0]

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += 30
        out.mkdir(parents=True, exist_ok=True)
        found = [] if knobs else [finding("precision", 50, {"tf32": True})]
        (out / "summary.json").write_text(json.dumps(profile(*found, step_ms=100.0)))
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        base, v = variants
        now[0] += 20
        base.rounds.append(Round([100.0] * 20, "median", 100.0, [], 0))
        if "--tensorcores" in (v.program or []):
            v.rounds.append(Round([], "median", None, [], 2, "the program exited with status 2: bad option"))
        else:
            v.rounds.append(Round([50.0] * 20, "median", 50.0, knob_records("tf32=1: set at start-up"), 0))
        return variants

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    t = tune_stages.Tuner([str(script)], tmp_path / "t", budget_s=600, clock=lambda: now[0], say=lambda m: None)
    assert program_options.words_for(t.levers, "tf32", True) == ["--tensorcores", "1"]
    d = t.run()
    first, second = d["stages"][:2]
    assert first["options"] == ["--tensorcores", "1"] and not first["kept"] and "a run failed" in first["why"]
    assert second["options"] is None and second["kept"] and d["kept_knobs"] == {"tf32": True}
    (option,) = d["options"]
    assert option["failed"] and option["kept"] is None
    assert d["permanent"][0]["script_flag"] is None and d["command"] == [str(script)]



def test_a_loss_that_is_nan_without_the_knob_too_does_not_reject_it():
    """Issue 52: a knob 1.72x faster was rejected for "the loss became NaN" where the loss was NaN without it too."""
    nan = (2.0, float("nan"))
    b = Variant({}, rounds(100, 100, losses=nan), added={})
    assert tune_trial.judge(b, Variant({"tf32": True}, rounds(58, 58, losses=nan), added={"tf32": True}))["kept"]
    clean = Variant({}, rounds(100, 100, losses=(2.0, 1.9)), added={})
    assert not tune_trial.judge(clean, Variant({"tf32": True}, rounds(58, 58, losses=nan), added={"tf32": True}))["kept"]


def test_tune_json_says_running_while_tune_goes_on_and_an_interrupt_after_the_first_profile_keeps_it(
        tmp_path, monkeypatch):
    """Issue 52: a killed tune left tune.json with stopped null (no documented value); Ctrl-C after stage 1's
    profile wrote no tune.json at all."""
    from nvtx_trace.capture.interrupts import Interrupted

    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    seen = []

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        out.mkdir(parents=True, exist_ok=True)
        found = [finding("precision", 20, {"tf32": True})] if knobs else [finding("fusion", 20, {"compile": True})]
        (out / "summary.json").write_text(json.dumps(profile(*found, step_ms=100.0)))
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        if (tmp_path / "t" / "tune.json").exists():
            seen.append(json.loads((tmp_path / "t" / "tune.json").read_text())["stopped"])
            raise Interrupted(2, "in round 1/2")
        for v in variants:
            ms = 100.0 if not v.added else 50.0
            said = knob_records(*(f"{tune.declared.text({k: x})}: applied" for k, x in (v.added or {}).items()))
            v.rounds.append(Round([ms] * 20, "median", ms, said, 0))
        return variants

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    with pytest.raises(Interrupted) as told:
        tune.run_tune(tune.TuneRequest([str(script)], out=tmp_path / "t", no_history=True))
    assert seen == ["running"]  # what a SIGKILL at that moment would have left
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert d["stopped"] == "interrupted" and len(d["kept_knobs"]) == 1 and len(d["stages"]) == 1
    assert tune.declared.text(d["kept_knobs"]) in told.value.kept

    # interrupted in the first trial: no stage ended, the first profile did
    def interrupted(*_a, **_k):
        raise Interrupted(2, "in round 1/2")

    monkeypatch.setattr(timing, "alternate", interrupted)
    with pytest.raises(Interrupted):
        tune.run_tune(tune.TuneRequest([str(script)], out=tmp_path / "u", no_history=True))
    d = json.loads((tmp_path / "u" / "tune.json").read_text())
    assert d["stopped"] == "interrupted" and d["stages"] == [] and d["remaining_from"]["profile"].endswith("profile")


@pytest.mark.torch
@pytest.mark.nsys
@pytest.mark.slow
def test_a_program_that_never_steps_is_the_documented_line_not_a_missing_summary(tmp_path):
    """Issue 52: a script with no training loop at all (nothing to analyze) said "the profile run wrote no
    summary.json (exit status 3)"; it is the documented line, with the profile's own reason after it."""
    from conftest import installed_nsys

    installed_nsys()
    script = tmp_path / "nosteps.py"
    script.write_text("import time\nimport torch\nx = torch.ones(3)\ntime.sleep(0.5)\nprint('done')\n")
    proc = cli("--no-history", "--out", str(tmp_path / "t"), str(script), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "the profile found no training steps" in last and "nothing to analyze" in last, last
    assert not list((tmp_path / "t").rglob("*.outcome.json"))  # read, then removed


def one_finding_then_none(now: list, seconds: float, kind: str, recommend: dict, predicted_ms: float,
                          saving_ms: float, step_ms: float):
    """A stand-in for tune_stages.profile that takes ``seconds`` on the clock ``now``: the program as it is has one
    finding (its predicted step and saving), a configuration with any knob none."""
    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += seconds
        out.mkdir(parents=True, exist_ok=True)
        found = [] if knobs else [{**finding(kind, predicted_ms, recommend),
                                   "predicted": {"step_ns": int(predicted_ms * 1e6), "saving_ns": int(saving_ms * 1e6),
                                                 "statistic": "median"}}]
        (out / "summary.json").write_text(json.dumps(profile(*found, step_ms=step_ms)))
        return out

    return fake_profile


def knobs_make_it_faster(now: list, by_ms: float):
    """A stand-in for timing.alternate: 10 s a run; every knob a variant adds takes ``by_ms`` off a 100-ms step."""
    from nvtx_trace import knobs as declared

    def alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        for v in variants:
            now[0] += 10
            ms = 100.0 - by_ms * len(v.knobs)
            lines = [f"{declared.text({k: val})}: set" for k, val in v.knobs.items()]
            v.rounds.append(Round([ms] * 20, "median", ms, knob_records(*lines), 0))
        return variants

    return alternate


@pytest.mark.parametrize("second, reused", [("dataloader_stall", True), ("fusion", False)])
def test_a_knob_of_another_part_of_the_step_is_tried_on_the_last_profile(tmp_path, monkeypatch, second, reused):
    """Issue 51, item 3: a loader setting after a precision setting needs no new profile (their areas differ),
    a profile saved a stage; compile after a precision setting does (it rewrites every GPU part)."""
    now, profiled = [0.0], []
    knob_of = {"precision": {"tf32": True}, "dataloader_stall": {"num_workers": 8}, "fusion": {"compile": True}}

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += 30
        out.mkdir(parents=True, exist_ok=True)
        found = [{**finding(k, ms, knob_of[k]), "predicted": {"step_ns": int(ms * 1e6), "saving_ns": int((100 - ms) * 1e6),
                                                            "statistic": "median"}}
                 for k, ms in (("precision", 50), (second, 80)) if not set(knob_of[k]) & set(knobs or {})]
        (out / "summary.json").write_text(json.dumps(profile(*found, step_ms=100.0)))
        profiled.append(out.parent.name)
        return out

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", knobs_make_it_faster(now, by_ms=20))
    said = []
    d = tune_stages.Tuner(["train.py"], tmp_path, budget_s=1000, clock=lambda: now[0], say=said.append).run()
    assert [s["knobs"] for s in d["stages"][:2]] == [{"tf32": True}, knob_of[second]]
    assert d["stages"][1]["profile_reused"] is reused and d["stages"][0]["profile_reused"] is False
    assert profiled[:2] == (["stage-1", "stage-3"] if reused else ["stage-1", "stage-2"])
    assert d["stages"][1]["profile_s"] is None if reused else d["stages"][1]["profile_s"] == 30
    assert any("no new profile: tf32=1 changed another part" in m for m in said) is reused


def test_the_final_check_is_reserved_at_the_slowest_run_so_the_budget_is_a_ceiling(tmp_path, monkeypatch):
    """Seen on an H200: the GPT-2 trainer's tune ended at 434.5 s on a 430 s budget, its final check's runs (the
    original program, the tuned one compiling) slower than a trial's mean run. The slowest run is reserved: a
    stand-in clock where the original program's runs take 20 s, a knob's 15 s and the configuration so far 5 s."""
    now = [0.0]

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += 30
        out.mkdir(parents=True, exist_ok=True)
        kind, knob = ("dataloader_stall", {"num_workers": 8}) if not knobs else ("pageable_h2d", {"pin_memory": True})
        f = {**finding(kind, 50, knob), "predicted": {"step_ns": int(50e6), "saving_ns": int(50e6), "statistic": "median"}}
        (out / "summary.json").write_text(json.dumps(profile(*([] if len(knobs or {}) > 1 else [f]), step_ms=100.0)))
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        for r in range(rounds):
            for v in variants:
                if settled and r and settled(variants):
                    return variants
                wall = 20.0 if not v.knobs else 15.0 if v.added else 5.0  # the original's runs are the slowest
                now[0] += wall
                ms = 100.0 / 2 ** len(v.knobs)
                said = [f"{declared.text({k: x})}: set" for k, x in v.knobs.items()]
                v.rounds.append(Round([ms] * 20, "median", ms, knob_records(*said), 0, parts={"wall_s": wall}))
        return variants

    from nvtx_trace import knobs as declared

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    finals = 0
    for budget in range(150, 260, 5):
        now[0] = 1000.0  # a clock that began long ago
        t = tune_stages.Tuner(["train.py"], tmp_path / str(budget), budget_s=budget, clock=lambda: now[0], say=lambda m: None)
        d = t.run()
        assert d["elapsed_s"] <= budget, (budget, d["elapsed_s"], d["stopped"])
        assert t.reserve_s() >= 2 * 20.0 + 30.0  # a round of the slowest runs and a profile, not the last mean
        finals += d["final_check"] is not None
    assert finals  # the final check ran within some of those budgets


@pytest.mark.parametrize("run_s, runs, stopped_early", [(30.0, 4, 0), (60.0, 2, 1)])
def test_a_first_trial_starts_on_one_round_and_its_own_runs_then_pace_it(tmp_path, monkeypatch, run_s, runs,
                                                                          stopped_early):
    """Seen on an H200: a compiled GPT's 200-s tune tried nothing, its 62-s profile guessing 43 s a plain run and 4
    runs to a trial (172 s). A trial starts where its first round (2 runs) fits the guess; the runs it made then
    say whether the next one fits: 30-s runs make a whole trial of 2 rounds within the budget, 60-s runs stop it
    after its first round, never past the budget."""
    now = [0.0]

    fake_profile = one_finding_then_none(now, 62, "fused_optimizer", {"fused_optimizer": True}, 90, 10, 100.0)
    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        for r in range(rounds):
            for v in variants:
                if settled and r and settled(variants):
                    return variants
                now[0] += run_s
                ms = 90.0 if v.added else 100.0
                said = [f"{declared.text({k: x})}: set" for k, x in v.knobs.items()]
                v.rounds.append(Round([ms] * 20, "median", ms + r * 0.01, knob_records(*said), 0,
                                      parts={"wall_s": run_s}))
        return variants

    from nvtx_trace import knobs as declared

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    d = tune_stages.Tuner(["train.py"], tmp_path, budget_s=200, clock=lambda: now[0], say=lambda m: None).run()
    trial = d["stages"][0]
    assert trial["knobs"] == {"fused_optimizer": True} and d["elapsed_s"] <= 200
    assert d["time"]["runs"] == runs and d["time"]["stopped_early"] == stopped_early


def test_a_chain_multiplies_the_kept_trials_and_never_mixes_their_statistics(tmp_path, monkeypatch):
    """Seen on an H200 (ResNet-18, loader-bound): num_workers kept at 214.59 -> 36.45 ms (medians), then a
    rejected trial timed the configuration's mean, 37.50 ms, and the chain said 214.59 -> 37.50 (5.72x). The chain
    is the kept trials' ratios: 5.89x here (200 -> 40 ms, then a rejected knob whose baseline reads 50 ms in means)."""
    now, trials = [0.0], []

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        now[0] += 30
        out.mkdir(parents=True, exist_ok=True)
        kind, knob = ("dataloader_stall", {"num_workers": 8}) if not knobs else ("layout_transpose",
                                                                                 {"channels_last": True})
        f = {**finding(kind, 30, knob), "predicted": {"step_ns": int(30e6), "saving_ns": int(10e6), "statistic": "median"}}
        (out / "summary.json").write_text(json.dumps(profile(*([] if len(knobs or {}) > 1 else [f]), step_ms=100.0)))
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        trials.append(1)
        statistic = "median" if len(trials) == 1 else "mean"
        for _ in range(rounds):
            for v in variants:
                now[0] += 10
                ms = {1: {False: 200.0, True: 40.0}, 2: {False: 50.0, True: 50.0}}[len(trials)][bool(v.added)]
                said = [f"{declared.text({k: x})}: set" for k, x in v.knobs.items()]
                v.rounds.append(Round([ms] * 20, statistic, ms, knob_records(*said), 0))
        return variants

    from nvtx_trace import knobs as declared

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    d = tune_stages.Tuner(["train.py"], tmp_path, budget_s=1000, clock=lambda: now[0], say=lambda m: None).run()
    assert [s["kept"] for s in d["stages"][:2]] == [True, False] and d["step_source"] == "stages"
    assert d["baseline_step_ms"] == 200.0 and d["final_step_ms"] == 40.0 and d["speedup"] == 5.0


def test_which_knobs_a_kept_knob_leaves_the_last_profile_true_for():
    """Each knob declares the part of a step it changes: attention or a loader setting after a precision setting
    keep the profile (the GPT-2 trainer's --flash came at stage 2 on stage 1's profile); a precision setting after
    a loader setting does not (the H200 image classifier's amp, 1.00x on 6 workers, tried on the profile before
    them), nor anything next to compile, nor a knob of the same part."""
    from nvtx_trace import knobs as declared

    assert not declared.interact({"sdpa": True}, {"tf32": True})
    assert not declared.interact({"num_workers": 8, "pin_memory": True}, {"amp": "bf16"})
    assert not declared.interact({"fused_optimizer": True}, {"amp": "bf16"})
    assert declared.interact({"amp": "bf16"}, {"num_workers": 6, "pin_memory": True})
    assert declared.interact({"channels_last": True}, {"amp": "bf16"})
    assert declared.interact({"tf32": True}, {"compile": True}) and declared.interact({"compile": True}, {"tf32": True})
    assert declared.interact({"num_workers": 12}, {"num_workers": 6})


def test_a_stage_whose_profile_fails_ends_tune_with_its_reason_and_a_failing_exit(tmp_path, monkeypatch):
    """Issue 52, items 8 and 13: a stage's profile failed (the disk full, the folder turned read-only) and tune
    ended with exit 0, nothing said. What was kept is written; the stop is one line and a non-zero exit."""
    from nvtx_trace.errors import NvtxTraceError
    from nvtx_trace.runner.profile_child import ProfileFailed

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    calls = []

    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        calls.append(out)
        if knobs:
            raise ProfileFailed("the profile run failed (exit status 5): nsys: the disk is full; its log: x.log")
        out.mkdir(parents=True, exist_ok=True)
        f = {**finding("dataloader_stall", 50, {"num_workers": 8}),
             "predicted": {"step_ns": int(50e6), "saving_ns": int(50e6), "statistic": "median"}}
        (out / "summary.json").write_text(json.dumps(profile(f, step_ms=100.0)))
        return out

    def fake_alternate(target, variants, rounds, python=None, progress=None, logs=None, settled=None):
        for v in variants:
            ms = 50.0 if v.knobs else 100.0
            v.rounds.append(Round([ms] * 20, "median", ms, knob_records("num_workers=8: DataLoader created"), 0))
        return variants

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", fake_alternate)
    with pytest.raises(NvtxTraceError, match="tune stopped after 1 stage.*the disk is full.*; kept so far: "
                                             "num_workers=8") as err:
        tune.run_tune(tune.TuneRequest([str(script)], out=tmp_path / "t", no_history=True))
    assert err.value.exit_code != 0 and len(calls) == 2
    d = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert d["stopped"].startswith("profile failed") and d["kept_knobs"] == {"num_workers": 8}


def test_a_trial_s_first_baseline_round_is_the_configuration_s_last_timed_run(tmp_path, monkeypatch):
    """Issue 51, item 3: the configuration so far was timed in the last trial, so that run is the next trial's first
    baseline round (A B, then B A): a run saved a stage, and a clear first round (15 % faster) costs one run. The
    real alternation, with stand-in runs whose step halves with each knob."""
    def fake_profile(program, python, out, knobs=None, stage="", log=None, env=None):
        out.mkdir(parents=True, exist_ok=True)
        kind, knob = ("dataloader_stall", {"num_workers": 8}) if not knobs else ("pageable_h2d", {"pin_memory": True})
        f = {**finding(kind, 50, knob), "predicted": {"step_ns": int(50e6), "saving_ns": int(50e6), "statistic": "median"}}
        (out / "summary.json").write_text(json.dumps(profile(*([] if len(knobs or {}) > 1 else [f]), step_ms=100.0)))
        return out

    ran = []

    def fake_time_once(target, knobs, python=None, cwd=None, timeout=None, log=None):
        ran.append(dict(knobs))
        ms = 100.0 / 2 ** len(knobs)
        return Round([ms] * 20, "median", ms, knob_records(*[f"{k}={int(v)}: set" for k, v in knobs.items()]), 0)

    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "time_once", fake_time_once)
    d = tune_stages.Tuner(["train.py"], tmp_path, budget_s=10_000, say=lambda m: None).run()
    first, second = d["stages"][:2]
    assert first["kept"] and second["kept"] and second["rounds_ms"]["baseline"] == [50.0]  # stage 1's variant run
    assert d["time"]["runs"] == 3  # 2 for stage 1 (A B, then clear), 1 for stage 2 (its A reused, B clear)
    assert ran[:3] == [{}, {"num_workers": 8}, {"num_workers": 8, "pin_memory": True}]


def test_a_trial_has_one_prediction_in_its_progress_line_and_in_its_row(tmp_path, monkeypatch):
    """Issue 52, item 18: the progress line said "predicted 43.34" and the table 43.79 for one trial (the row was
    predicted again off the baseline the trial measured). One prediction, said before the trial, in both."""
    now = [0.0]

    # the profile runs slower than plain (120 ms against 100)
    fake_profile = one_finding_then_none(now, 30, "precision", {"tf32": True}, 60, 60, 120.0)
    monkeypatch.setattr(tune_stages, "profile", fake_profile)
    monkeypatch.setattr(timing, "alternate", knobs_make_it_faster(now, by_ms=40))  # plain: 100 ms, not 120
    said = []
    d = tune_stages.Tuner(["train.py"], tmp_path, budget_s=1000, clock=lambda: now[0], say=said.append).run()
    row = d["stages"][0]
    line = next(m for m in said if "stage 1: trying" in m)
    assert f"-> {row['predicted_step_ms']:.2f} ms" in line, (line, row["predicted_step_ms"])
