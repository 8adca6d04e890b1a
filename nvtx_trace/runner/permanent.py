"""How to keep the settings ``tune`` kept: the lines to put in the user's code, in the form the program uses.

The settings record names the framework driving the loop (plain PyTorch, a Hugging Face Trainer, Lightning);
where the script has a command-line flag of its own for a knob (``--compile``, ``--num-workers``), that flag
is named first. The user's files are only read, never edited.
"""

from __future__ import annotations

import re
from pathlib import Path

from nvtx_trace import framework_options

# the script's own flags that set a knob, as scripts commonly name them (matched in add_argument calls)
FLAGS = {"tf32": ("tf32", "allow-tf32", "allow_tf32"), "amp": ("bf16", "amp"),
         "compile": ("compile", "torch-compile", "torch_compile"),
         "num_workers": ("num-workers", "num_workers", "workers"),
         "pin_memory": ("pin-memory", "pin_memory"), "channels_last": ("channels-last", "channels_last"),
         "cudnn_benchmark": ("cudnn-benchmark", "cudnn_benchmark")}


def _pytorch(knob: str, value, settings: dict) -> list[str]:
    opt = ((settings.get("optimizers") or [{}])[0] or {}).get("class") or "AdamW"
    loader = ((settings.get("dataloaders") or [{}])[0] or {}).get("loader")
    at = f"  # the DataLoader at {loader}" if loader else ""
    return {
        "tf32": ["torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.allow_tf32 = True"],
        "amp": ['with torch.autocast("cuda", dtype=torch.bfloat16):  # around the forward and the loss, not '
                "backward()", "    loss = criterion(model(inputs), targets)"],
        "compile": ["model = torch.compile(model)  # after moving it to the GPU, before the loop"],
        "channels_last": ["model = model.to(memory_format=torch.channels_last)",
                          "inputs = inputs.to(memory_format=torch.channels_last)  # each batch, in the loop"],
        "cudnn_benchmark": ["torch.backends.cudnn.benchmark = True"],
        "fused_optimizer": [f"optimizer = torch.optim.{opt}(model.parameters(), ..., fused=True)"],
        "foreach_optimizer": [f"optimizer = torch.optim.{opt}(model.parameters(), ..., foreach=True)"],
        "set_to_none": ["optimizer.zero_grad(set_to_none=True)"],
        "no_empty_cache": ["# remove torch.cuda.empty_cache() from the training loop"],
        "num_workers": [f"DataLoader(..., num_workers={value}){at}"],
        "pin_memory": [f"DataLoader(..., pin_memory={bool(value)}){at}"],
        "persistent_workers": [f"DataLoader(..., persistent_workers={bool(value)}){at}"],
        "prefetch_factor": [f"DataLoader(..., prefetch_factor={value}){at}"],
    }.get(knob, [])


def _framework(knob: str, value, settings: dict) -> tuple[str, list[str]]:
    """(whose option it is, the lines): the framework's own where it has one, else plain PyTorch's."""
    name = framework_options.framework_of(settings)
    own = framework_options.option(name, knob, value)
    if own:
        return name, [own]
    if name == "lightning" and knob in ("fused_optimizer", "foreach_optimizer"):
        return name, ["# in configure_optimizers():", *_pytorch(knob, value, settings)]
    return "pytorch", _pytorch(knob, value, settings)


def script_flags(script: Path | None) -> set[str]:
    """The long options the script's own argparse declares (read, never run)."""
    if script is None:
        return set()
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return set(re.findall(r"""add_argument\(\s*(?:["']-\w["']\s*,\s*)?["']--?([\w-]+)["']""", text))


def lines(kept: dict, settings: dict, script: Path | None) -> list[dict]:
    """One entry per kept knob: the framework's own option, the script's flag where it has one."""
    flags = script_flags(script)
    out = []
    for knob, value in kept.items():
        framework, code = _framework(knob, value, settings)
        flag = next((f for f in FLAGS.get(knob, ()) if f in flags), None)
        flag_text = None if flag is None else f"--{flag} {value}" if knob == "num_workers" else f"--{flag}"
        out.append({"knob": knob, "value": value, "framework": framework, "lines": code,
                    "script_flag": flag_text})
    return out
