"""Findings only the settings record can give (kernel names cannot show them), under a real nsys on CPU:
``python -m nvtx_autotrace programs/cpu_settings_train.py`` (DataParallel, a conv bias before batch norm,
anomaly detection, AdamW foreach=False, zero_grad(set_to_none=False)), exported and analyzed."""

from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest
from conftest import ROOT, installed_nsys, need

pytestmark = [pytest.mark.nsys, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.capture import export
    from nvtx_trace.capture import profile as profiling

    need("PyTorch", importlib.util.find_spec("torch") is not None)
    found = installed_nsys()
    if found.year <= 2022:
        need("nvtx==0.2.11 (for nsys 2022.x)", importlib.metadata.version("nvtx") == "0.2.11")
    out = tmp_path_factory.mktemp("settings") / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("NVTX_AUTOTRACE", None)
    result = profiling.profile(found, [sys.executable, "-m", "nvtx_autotrace", "programs/cpu_settings_train.py"],
                               out, trace=["nvtx", "osrt"], extra=["-s", "none", "--cpuctxsw", "none"],
                               env=env, cwd=ROOT, capture_output=True)
    assert result.returncode == 0, result.log[-2000:]
    return analyze(export.export_sqlite(found, result.require_report()))


def test_the_record_says_what_the_program_set(analysis):
    s = analysis.settings
    assert s["wrappers"] == ["DataParallel"] and s["anomaly_detection"] is True
    assert s["conv_bias_before_bn"] == {"count": 1, "examples": ["module.0"]}
    assert s["optimizers"][0]["foreach"] is False and s["zero_grad_set_to_none"] is False
    assert s["empty_cache_per_step"] == pytest.approx(1.0, abs=0.5)  # as of step 2: one call after step 1 (of 2)


def test_settings_only_findings_are_raised_and_say_they_are_recorded(analysis):
    by_kind = {f.kind: f for f in analysis.findings}
    assert {"data_parallel", "conv_bias_before_bn", "debug_apis"} <= set(by_kind)
    assert by_kind["conv_bias_before_bn"].evidence["examples"] == ["module.0"]
    assert "bias=False" in by_kind["conv_bias_before_bn"].fix
    assert "DistributedDataParallel" in by_kind["data_parallel"].fix
    debug = by_kind["debug_apis"]
    assert debug.evidence["on"] == ["anomaly detection"] and debug.evidence["facts"].startswith("recorded")
    assert debug.predicted is None  # no GPU work measured on a CPU run: nothing to bound the step by
    for kind in ("data_parallel", "conv_bias_before_bn"):
        assert by_kind[kind].predicted is None and "No prediction" in by_kind[kind].fix


def test_a_fix_is_said_in_the_options_of_the_framework_driving_the_loop():
    """The settings record names the framework: a Lightning user is told Trainer(precision="bf16-mixed") and
    set_float32_matmul_precision, an HF Trainer user TrainingArguments; plain PyTorch gets no extra sentence."""
    from types import SimpleNamespace

    from nvtx_trace.analyzer.findings import Finding
    from nvtx_trace.analyzer.questions.ranking import _in_the_framework_s_words

    def said(framework, recommend):
        f = Finding("precision", "t", 1, "Turn on TF32.", recommend=recommend)
        _in_the_framework_s_words(SimpleNamespace(settings={"framework": {"name": framework}}), [f])
        return f.fix

    assert said("lightning", {"tf32": True, "amp": "bf16"}) == (
        'Turn on TF32. In Lightning: torch.set_float32_matmul_precision("high"); '
        'Trainer(..., precision="bf16-mixed").')
    assert said("hf_trainer", {"num_workers": 8, "pin_memory": True}) == (
        "Turn on TF32. In Hugging Face Trainer: TrainingArguments(..., dataloader_num_workers=8); "
        "TrainingArguments(..., dataloader_pin_memory=True).")
    assert said("pytorch", {"tf32": True}) == said("lightning", {"pin_memory": True}) == "Turn on TF32."


def test_the_html_settings_table_reads_as_words_not_json():
    """Issue 42: the HTML settings table dumped each nested value as JSON (braces, quotes)."""
    from pathlib import Path

    from conftest import sample_analysis

    from nvtx_trace.report import html

    a = sample_analysis(Path(__file__).resolve().parents[1] / "sample_reports" / "heldout_gpt_accum_h200.sqlite")
    assert any(isinstance(v, (dict, list)) for v in a.settings.values())  # nested values to show
    page = html.render(a)
    table = page.split("Settings, recorded by nvtx_autotrace", 1)[1].split("</table>", 1)[0]
    assert "{&quot;" not in table and '{"' not in table and "optimizers" in table
