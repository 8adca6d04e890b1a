"""The program's own options as levers (issue 51): read from the script's source, never run; mapped to the knob
that does the same by the knob's declared words; a trial changes the command line only."""

from __future__ import annotations

import textwrap

import pytest

from nvtx_trace.runner import program_options as po

# shaped like a public GPT-2 trainer's, an image classifier's (timm-like) and a nanoGPT configurator
GPT2_LIKE = '''
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--input_bin", type=str, default="data.bin")
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--learning_rate", type=float, default=1e-4)
parser.add_argument("--tensorcores", type=int, default=0, help="use tensorcores")
parser.add_argument("--dtype", type=str, default="float32", help="float32|float16|bfloat16")
parser.add_argument("--flash", type=int, default=0, help="use flash attention")
parser.add_argument("--compile", type=int, default=0, help="torch.compile the model")
args = parser.parse_args()
'''
IMAGES_LIKE = '''
import argparse
parser = argparse.ArgumentParser()
group = parser.add_argument_group("Misc")
group.add_argument("data_dir", metavar="DIR")
group.add_argument("-j", "--workers", type=int, default=4, metavar="N")
group.add_argument("--pin-mem", action="store_true", default=False)
group.add_argument("--no-prefetcher", action="store_true", default=False)
group.add_argument("--amp", action="store_true", default=False)
group.add_argument("--amp-dtype", default="float16", type=str)
group.add_argument("--channels-last", action="store_true", default=False)
group.add_argument("--lr", type=float, default=None)
group.add_argument("-v", "--verbose", action="count", default=0)
'''
NANOGPT_LIKE = '''
batch_size = 12
gradient_accumulation_steps = 40
dtype = 'bfloat16'
compile = False
exec(open('configurator.py').read())
'''


def _script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_gpt2_trainer_s_flags_map_to_its_attention_precision_and_compile(tmp_path):
    options = po.read(_script(tmp_path, GPT2_LIKE))
    assert [o.flag for o in options] == ["--input_bin", "--batch_size", "--learning_rate", "--tensorcores",
                                         "--dtype", "--flash", "--compile"]
    found = po.levers(options)
    assert sorted(found) == ["amp", "compile", "sdpa", "tf32"]  # never the batch, the rate, the data
    assert po.words_for(found, "sdpa", True) == ["--flash", "1"]
    assert po.words_for(found, "amp", "bf16") == ["--dtype", "bfloat16"]  # the default's own spelling
    assert po.words_for(found, "tf32", True) == ["--tensorcores", "1"]
    assert po.words_for(found, "compile", True) == ["--compile", "1"]
    assert po.words_for(found, "compile", "reduce-overhead") is None  # an int cannot say a mode
    assert po.words_for(found, "amp", "fp16") == ["--dtype", "float16"]  # said, though tune never tries fp16


def test_an_image_classifier_s_switches_and_worker_count(tmp_path):
    options = po.read(_script(tmp_path, IMAGES_LIKE))
    assert "data_dir" not in [o.flag for o in options] and "--verbose" not in [o.flag for o in options]
    found = po.levers(options)
    assert po.words_for(found, "num_workers", 14) == ["--workers", "14"]
    assert po.words_for(found, "num_workers", 4) is None  # its default already
    assert po.words_for(found, "pin_memory", True) == ["--pin-mem"]
    assert po.words_for(found, "pin_memory", False) is None  # a switch cannot be turned off
    assert po.words_for(found, "channels_last", True) == ["--channels-last"]
    # bf16 autocast is two options there: the dtype, and the switch that turns autocast on
    assert po.words_for(found, "amp", "bf16") == ["--amp-dtype", "bfloat16", "--amp"]


def test_a_nanogpt_configurator_s_globals_are_key_equals_value(tmp_path):
    options = po.read(_script(tmp_path, NANOGPT_LIKE))
    assert [(o.flag, o.kind, o.default) for o in options] == [
        ("--batch_size", "global", 12), ("--gradient_accumulation_steps", "global", 40),
        ("--dtype", "global", "bfloat16"), ("--compile", "global", False)]
    found = po.levers(options)
    assert po.words_for(found, "compile", True) == ["--compile=True"]
    assert po.words_for(found, "amp", "bf16") is None  # bf16 already
    assert po.with_words(["train.py", "config/x.py", "--compile=False"], options, ["--compile=True"]) == [
        "train.py", "config/x.py", "--compile=True"]


@pytest.mark.parametrize("program, words, want", [
    (["t.py", "-j", "4", "--lr", "0.1"], ["--workers", "14"], ["t.py", "--lr", "0.1", "--workers", "14"]),
    (["t.py", "-j4"], ["--workers", "14"], ["t.py", "--workers", "14"]),
    (["t.py", "--workers=3", "x"], ["--workers", "14"], ["t.py", "x", "--workers", "14"]),
    (["t.py"], ["--pin-mem"], ["t.py", "--pin-mem"]),
    (["torchrun", "--nproc_per_node=2", "t.py", "--workers", "2"], ["--workers", "8"],
     ["torchrun", "--nproc_per_node=2", "t.py", "--workers", "8"]),
    (["-m", "pkg.train", "--workers", "2"], ["--workers", "8"], ["-m", "pkg.train", "--workers", "2"]),
])
def test_a_trial_changes_the_command_line_only_where_the_option_is(tmp_path, program, words, want):
    options = po.read(_script(tmp_path, IMAGES_LIKE))
    assert po.with_words(program, options, words) == want


@pytest.mark.parametrize("text", ["", "def broken(:\n", "import argparse\np = argparse.ArgumentParser()\n"])
def test_no_options_or_a_script_that_does_not_parse_is_no_lever(tmp_path, text):
    assert po.levers(po.read(_script(tmp_path, text))) == {}
    assert po.read(tmp_path / "missing.py") == [] and po.read(None) == []


def test_an_option_choosing_the_attention_maps_only_where_its_choices_name_a_fused_one(tmp_path):
    options = po.read(_script(tmp_path, """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--attn", choices=["manual", "sdpa"], default="manual")
p.add_argument("--attention", type=int, default=12, help="heads")
p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
"""))
    found = po.levers(options)
    assert po.words_for(found, "sdpa", True) == ["--attn", "sdpa"]
    assert [lever.option.flag for lever in found["sdpa"]] == ["--attn"]  # a number of heads is no attention kind
    assert po.words_for(found, "amp", "bf16") == ["--dtype", "bf16"]


def test_a_script_parsing_training_arguments_takes_their_fields_as_options(tmp_path):
    """HfArgumentParser makes each TrainingArguments field an option of its name: bf16, tf32, torch_compile(_mode),
    the dataloader's, optim (with adamw_torch_fused): what a Trainer user keeps is the command line."""
    options = po.read(_script(tmp_path, """
from transformers import HfArgumentParser, TrainingArguments
parser = HfArgumentParser((TrainingArguments,))
(args,) = parser.parse_args_into_dataclasses()
"""))
    found = po.levers(options)
    assert po.words_for(found, "amp", "bf16") == ["--bf16"]
    assert po.words_for(found, "tf32", True) == ["--tf32", "True"]  # Optional[bool]: it takes its value
    assert po.words_for(found, "compile", True) == ["--torch_compile"]
    assert po.words_for(found, "compile", "reduce-overhead") == ["--torch_compile_mode", "reduce-overhead"]
    assert po.words_for(found, "num_workers", 8) == ["--dataloader_num_workers", "8"]
    assert po.words_for(found, "pin_memory", True) is None  # on by default
    assert po.words_for(found, "fused_optimizer", True) == ["--optim", "adamw_torch_fused"]


def test_a_lightning_cli_script_takes_the_trainer_s_precision(tmp_path):
    options = po.read(_script(tmp_path, "from lightning.pytorch.cli import LightningCLI\nLightningCLI(Model, Data)\n"))
    found = po.levers(options)
    assert po.words_for(found, "amp", "bf16") == ["--trainer.precision", "bf16-mixed"]
    assert po.words_for(found, "cudnn_benchmark", True) == ["--trainer.benchmark", "True"]
