"""How to keep the settings ``tune`` kept: the lines to put in the user's code, in the form the program uses.

The settings record names the framework driving the loop (plain PyTorch, a Hugging Face Trainer, Lightning);
where the script has a command-line flag of its own for a knob (``--compile``, ``--num-workers``), that flag
is named first. Every line comes from the knob's declaration (nvtx_trace/knobs/). The user's files are only read,
never edited.
"""

from __future__ import annotations

from nvtx_trace import knobs as declared
from nvtx_trace.runner import program_options


def lines(kept: dict, settings: dict, levers: dict | None = None, via: dict | None = None) -> list[dict]:
    """One entry per kept knob: the framework's own option, and the script's own option where it has one
    (``levers``, program_options.levers); ``via``: the knobs tune kept through those options (their words)."""
    out = []
    for name, value in kept.items():
        framework, code = declared.keep_lines(name, value, settings)
        words = (via or {}).get(name) or program_options.words_for(levers or {}, name, value)
        out.append({"knob": name, "value": value, "framework": framework, "lines": code,
                    "script_flag": " ".join(words) if words else None, "through_option": name in (via or {})})
    return out
