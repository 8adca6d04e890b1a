"""How to keep the settings ``tune`` kept: the lines to put in the user's code, in the form the program uses.

The settings record names the framework driving the loop (plain PyTorch, a Hugging Face Trainer, Lightning);
where the script has a command-line flag of its own for a knob (``--compile``, ``--num-workers``), that flag
is named first. Every line comes from the knob's declaration (nvtx_trace/knobs/). The user's files are only read,
never edited.
"""

from __future__ import annotations

import re
from pathlib import Path

from nvtx_trace import knobs as declared


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
    for name, value in kept.items():
        framework, code = declared.keep_lines(name, value, settings)
        knob = declared.get(name)
        flag = next((f for f in (knob.option_words if knob else ()) if f in flags), None)
        flag_text = None if flag is None else f"--{flag} {value}" if knob.option_takes_value else f"--{flag}"
        out.append({"knob": name, "value": value, "framework": framework, "lines": code, "script_flag": flag_text})
    return out
