"""Knobs as declarations (issue 50): one module each in nvtx_trace/knobs/, everything else derived from them.

A knob's name appears only in its declaration, in nvtx_autotrace (which applies it) and in the questions that
recommend it; a declaration of the user's own (``$NVTX_TRACE_KNOBS``) is accepted by ``try``, applied in the
program, reported back through the window file and made permanent, without another file touched."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, sample_analysis
from question_snapshots import SAMPLES

from nvtx_trace import knobs as declared

# where knob names may not be written: they derive every list from the declarations
DERIVED = [p for p in sorted((ROOT / "nvtx_trace").rglob("*.py"))
           if not p.relative_to(ROOT).as_posix().startswith(("nvtx_trace/knobs/", "nvtx_trace/analyzer/questions/"))]
# words that are a knob's name and, in these modules, something else: the math a step runs in (device_peaks)
OTHER_MEANINGS = {("nvtx_trace/device_peaks.py", "tf32")}


def test_every_module_declares_one_knob_and_every_knob_reads_its_own_text():
    modules = [p.stem for p in (ROOT / "nvtx_trace" / "knobs").glob("*.py") if p.stem not in ("__init__", "knob")]
    assert sorted(modules) == sorted(declared.names())
    for knob in declared.registry().values():
        value = {bool: True, int: max(knob.minimum, 2), str: next(iter(knob.choices.values()), "x")}[knob.value]
        assert declared.parse(declared.text({knob.name: value})) == {knob.name: value}
        assert declared.from_json(declared.to_json({knob.name: value})) == {knob.name: value}
        assert knob.what and knob.fixes and knob.plain_lines(value, declared.where_of({})), knob.name


def _string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_no_knob_name_is_written_outside_its_declaration_nvtx_autotrace_and_the_questions():
    names = set(declared.names())
    found = [f"{p.relative_to(ROOT)}:{line}: {value!r}" for p in DERIVED for line, value in _string_constants(p)
             if value in names and (p.relative_to(ROOT).as_posix(), value) not in OTHER_MEANINGS]
    assert found == []


def test_the_check_finds_a_planted_name(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""doc naming amp is fine."""\nBOUNDS = {"amp": 0.02}\n')
    assert [v for _, v in _string_constants(planted)] == ["amp"]


@pytest.mark.parametrize("report", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_a_knob_a_finding_recommends_declares_that_it_fixes_it(report):
    for f in sample_analysis(report).findings:
        for name in (f.recommend or {}):
            knob = declared.get(name)
            if knob is not None:
                assert f.kind in knob.fixes, f"{report.stem}: {f.kind} recommends {name}, whose fixes are {knob.fixes}"


def test_tune_s_bounds_and_refusals_come_from_the_declarations():
    assert declared.loss_bound({"pin_memory": True}) == 0.0
    assert declared.loss_bound({"pin_memory": True, "amp": "bf16"}) == declared.get("amp").loss_bound == 0.02
    assert declared.for_tune({"amp": "fp16", "tf32": True}) == {"tf32": True}
    assert declared.numerics({"num_workers": 2, "compile": True, "tf32": True}) == ["compile", "tf32"]
    assert declared.precision({"tf32": True}) == "tf32" and declared.precision({"tf32": True, "amp": "bf16"}) == "bf16"


def test_compile_s_mode_is_kept_in_the_lines_that_keep_it():
    """Issue 51, item 7: a kept compile=reduce-overhead is torch.compile(model, mode="reduce-overhead")."""
    from nvtx_trace.runner import permanent

    (plain,) = permanent.lines({"compile": "reduce-overhead"}, {}, None)
    assert plain["lines"] == ['model = torch.compile(model, mode="reduce-overhead")  # after moving it to the GPU, '
                              "before the loop"]
    (hf,) = permanent.lines({"compile": "reduce-overhead"}, {"framework": {"name": "hf_trainer"}}, None)
    assert hf["lines"] == ['TrainingArguments(..., torch_compile=True, torch_compile_mode="reduce-overhead")']
    (default,) = permanent.lines({"compile": True}, {}, None)
    assert default["lines"][0].startswith("model = torch.compile(model)  #")


def test_a_bad_declaration_of_the_user_s_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "not_a_knob.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(declared.EXTRA_ENV, "not_a_knob")
    with pytest.raises(ValueError, match="not_a_knob declares no KNOB"):
        declared.parse("tf32=1")
    monkeypatch.setenv(declared.EXTRA_ENV, "no_such_module_here")
    with pytest.raises(ValueError, match="cannot import no_such_module_here"):
        declared.names()


THREADS = '''"""A knob of the user's own: the CPU threads torch's intra-op pool uses."""

from nvtx_trace.knobs import Knob, template


def install(value, report):
    import torch

    torch.set_num_threads(value)
    report(f"torch.set_num_threads({value}); the pool now has {torch.get_num_threads()} thread(s)")


KNOB = Knob("intra_op_threads", int, "torch.set_num_threads(N)", applied="call", install=install, loss_bound=0.0,
            fixes=("cpu_overhead",), pytorch=template("torch.set_num_threads({v})  # at the start of the script"))
'''


@pytest.mark.torch
@pytest.mark.slow
def test_a_knob_declared_in_a_module_of_the_user_s_is_tried_applied_reported_and_made_permanent(tmp_path):
    (tmp_path / "my_threads_knob.py").write_text(THREADS)
    env = {**os.environ, declared.EXTRA_ENV: "my_threads_knob",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = tmp_path / "try.json"
    proc = subprocess.run([sys.executable, "-m", "nvtx_trace.cli", "try", "--no-history", "--rounds", "1", "--json",
                           str(out), "--out", str(tmp_path / "tried"), "intra_op_threads=1", "programs/cpu_train.py",
                           "--steps", "300", "--sample-ms", "1"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    variant = json.loads(out.read_text())["variants"][1]
    assert variant["knobs"] == {"intra_op_threads": 1} and variant["unapplied"] == []
    assert variant["changed"] == ["intra_op_threads=1: torch.set_num_threads(1); the pool now has 1 thread(s)"]
    assert variant["measured_step_ms"] and variant["numerics"] == []
    # made permanent from its declaration alone
    lines = subprocess.run([sys.executable, "-c", "import json; from nvtx_trace.runner import permanent; "
                            "print(json.dumps(permanent.lines({'intra_op_threads': 1}, {}, None)))"],
                           cwd=ROOT, env=env, text=True, capture_output=True, check=True).stdout
    assert json.loads(lines)[0]["lines"] == ["torch.set_num_threads(1)  # at the start of the script"]


def test_every_knob_has_its_row_in_the_docs():
    table = (ROOT / "docs" / "try.md").read_text(encoding="utf-8").split("## Knobs", 1)[1].split("\n## ", 1)[0]
    assert [n for n in declared.names() if f"`{n}=" not in table] == []


def test_a_convolution_net_in_fp32_is_measured_against_the_tf32_peak_cudnn_runs_it_in():
    """Issue 51, item 7: cuDNN runs fp32 convolutions in TF32 by PyTorch's default; a ResNet's share of the fp32
    peak was wrong. Matmuls stay fp32 unless allowed; a program that turns cuDNN's TF32 off is fp32 again."""
    from nvtx_trace.device_peaks import precision_of

    resnet = {"model_flops_per_step": 100, "model_conv_flops_per_step": 90, "cudnn_allow_tf32": True}
    gpt = {"model_flops_per_step": 100, "model_conv_flops_per_step": 0, "cudnn_allow_tf32": True}
    assert precision_of(resnet) == "tf32" and precision_of(gpt) == "fp32"
    assert precision_of({**resnet, "cudnn_allow_tf32": False}) == "fp32"
    assert precision_of(gpt, {"tf32": True}) == "tf32" and precision_of(resnet, {"amp": "bf16"}) == "bf16"


@pytest.mark.torch
def test_the_flop_count_keeps_the_convolutions_apart():
    """The counter's convolution share, against the formula: Conv2d(3, 8, 3) on 2 x 3 x 16 x 16 (padding 1) is
    2 * 2*16*16 * 8 * 3*3*3 = 221,184 FLOPs forward; a Linear(8, 4) beside it is not a convolution."""
    import torch

    from nvtx_autotrace.flops import _counter

    conv, linear = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        count = _counter()
        with count:
            conv(torch.ones(2, 3, 16, 16))
            linear(torch.ones(5, 8))
    assert count.conv == 2 * 2 * 16 * 16 * 8 * 27 and count.total == count.conv + 2 * 5 * 8 * 4


@pytest.mark.torch
@pytest.mark.slow  # a process of its own (issue 54: the unit loop runs in-process)
def test_a_declaration_of_the_user_s_that_does_not_load_never_harms_the_program(tmp_path):
    """$NVTX_TRACE_KNOBS naming a module that is not there: the program runs to its end, one warning says why."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint('trained', torch.ones(2).sum().item())\n")
    env = {**os.environ, declared.EXTRA_ENV: "no_such_knob_module", "NVTX_AUTOTRACE_TRY": '{"tf32": true}',
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "nvtx_autotrace", str(script)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "trained 2.0" in proc.stdout, proc.stderr[-2000:]
    assert "no_such_knob_module" in proc.stderr and "Traceback" not in proc.stderr


def test_analyze_reads_no_declaration_of_the_user_s_that_does_not_load(monkeypatch):
    """The analyzer names knobs in its fixes (the framework's own option): a broken $NVTX_TRACE_KNOBS leaves it to
    this folder's declarations; the commands that apply knobs say the error in one line (above)."""
    monkeypatch.setenv(declared.EXTRA_ENV, "no_such_knob_module")
    assert declared.get("tf32") is not None and declared.get("no_such") is None
    assert declared.sentence({"framework": {"name": "lightning"}}, {"amp": "bf16"}).startswith(" In Lightning")
    with pytest.raises(ValueError, match="cannot import no_such_knob_module"):
        declared.parse("tf32=1")
