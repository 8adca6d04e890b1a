"""The declaration of one knob: everything the tool knows of it, in one place (docs/architecture.md, "Add a knob").

A knob applies a finding's fix without editing the script (``nvtx-trace try``, ``tune``, ``run --try``). Its
declaration says how its value is written, how nvtx_autotrace applies it inside the program (``applied``), how far
it may move the first losses (``loss_bound``), which findings it fixes, and how the user keeps it: the lines in
plain PyTorch, in a Hugging Face ``TrainingArguments`` or a Lightning ``Trainer``, and the words a script's own
command-line flag for the same setting is commonly named by. Torch-free: the runner and the analyzer read it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

YES, NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# where nvtx_autotrace applies a knob (nvtx_autotrace/knobs.py):
APPLIED = {
    "dataloader": "a DataLoader argument of the knob's name, set as each DataLoader is built",
    "backend": "attributes of torch.backends set at start-up and again when step 1 begins (``backend``)",
    "optimizer": "an optimizer constructor's argument (``optimizer_arg``), set as each optimizer is built",
    "model": "applied when step 1 begins to the models the optimizer trains",
    "call": "at start-up, by nvtx_autotrace or by the declaration's own ``install(value, report)``",
    "option": "only through the program's own option (tune reads its command line); nvtx_autotrace says so",
}
# what part of a step a knob changes: tune tries a knob on the last profile, without profiling again, where the
# knobs kept since it change another part (a loader setting after a precision setting, not the reverse: a loader
# that still binds hides any other saving); "" (a declaration of yours that says none) and "graph" (torch.compile
# rewrites every part on the GPU) change every part (knobs.interact)
AREAS = {
    "loader": "how batches are made and handed over (DataLoader workers, pinned memory)",
    "math": "the kernels matrix work runs in (precision, layout, algorithm choice)",
    "attention": "how attention is computed",
    "graph": "every GPU part at once (torch.compile)",
    "optimizer": "the optimizer step and gradient reset",
    "host": "the host's own calls between kernels (an empty_cache, a DataParallel wrapper)",
    "": "unknown: every part",
}


@dataclass(frozen=True)
class Knob:
    name: str
    value: type  # bool, int or str: what KNOB=VALUE holds
    what: str  # one line: what it changes (try's help, docs/try.md's table)
    applied: str  # a key of APPLIED
    order: int = 100  # listing order (help, errors)
    choices: dict = field(default_factory=dict)  # words accepted besides the type's own: word -> value
    choices_are: str = ""  # what the choices are, for an error ("a mode")
    minimum: int = 1  # an int knob's smallest value
    backend: tuple = ()  # applied "backend": dotted attributes under torch set to bool(value)
    needs_workers: bool = False  # applied "dataloader": DataLoader refuses it without worker processes
    optimizer_arg: str = ""  # applied "optimizer": the constructor argument set to True
    install: Callable | None = None  # applied "call" by a declaration of yours: install(value, report) in the program
    loss_bound: float = 0.01  # how far the first steps' losses may move with it, beyond the baseline's own noise
    numerics: bool = False  # it changes the program's arithmetic (try shows it beside the timing)
    refused_by_tune: Callable[[object], str] | None = None  # value -> why tune never applies it ("" where it does)
    fixes: tuple = ()  # the finding kinds whose fix it applies
    pytorch: Callable[[object, dict], list] | None = None  # (value, where) -> the plain PyTorch lines
    frameworks: dict = field(default_factory=dict)  # framework -> template, lines or (value -> lines or None)
    option_words: tuple = ()  # how a script's own flag for the same setting is commonly spelled
    option_takes_value: bool = False  # that flag takes the value (``--workers 8``), else it is a switch
    option_enables: tuple = ()  # a switch that turns the setting on while another option says how (timm's --amp)
    option_choosers: tuple = ()  # options that choose among implementations (--attn manual|sdpa): mapped only
    # where their declared choices include one of the knob's own words
    option_with: tuple = ()  # a second option that moves against it, both integers (the accumulation steps a
    # micro-batch N times larger divides by N): the knob maps only where the program has both
    precision: Callable[[object], str | None] | None = None  # value -> the math a step's matrix work then runs in
    observed: Callable[[dict], object] | None = None  # summary.json -> the value the report shows it has
    area: str = ""  # a key of AREAS: what part of a step it changes

    def __post_init__(self):
        if self.applied not in APPLIED:
            raise ValueError(f"knob {self.name}: applied={self.applied!r}, expected one of {', '.join(APPLIED)}")
        if self.area not in AREAS:
            raise ValueError(f"knob {self.name}: area={self.area!r}, expected one of {', '.join(a for a in AREAS if a)}")
        if self.value not in (bool, int, str):
            raise ValueError(f"knob {self.name}: value must be bool, int or str")

    def parse(self, text: str):
        """``"on"`` -> True, ``"8"`` -> 8, ``"bfloat16"`` -> ``"bf16"``; ValueError says what is expected."""
        word = str(text).strip()
        if word.lower() in self.choices:
            return self.choices[word.lower()]
        if self.value is int:
            try:
                number = int(word)
            except ValueError:
                raise ValueError(f"{self.name}={word!r}: expected a whole number") from None
            if number < self.minimum:
                raise ValueError(f"{self.name}={word!r}: too small (at least {self.minimum})")
            return number
        if self.value is bool:
            if word.lower() in YES:
                return True
            if word.lower() in NO:
                return False
            extra = f" or {self.choices_are} ({', '.join(self.choices)})" if self.choices else ""
            raise ValueError(f"{self.name}={word!r}: expected 1 or 0{extra}")
        shown = " or ".join(dict.fromkeys(str(v) for v in self.choices.values())) or "a value"
        raise ValueError(f"{self.name}={word!r}: expected {shown}")

    def check(self, value):
        """A value as JSON carries it (the program's side, tune's configuration), checked as the text would be."""
        if isinstance(value, bool) or self.value is not bool or value in self.choices.values():
            return self.parse(str(int(value)) if isinstance(value, bool) else str(value))
        raise ValueError(f"{self.name}={value!r}: expected 1 or 0")

    def text(self, value) -> str:
        return f"{self.name}={int(value) if isinstance(value, bool) else value}"

    def lines_in(self, framework: str, value, where: dict) -> list[str] | None:
        """The framework's own lines for ``value`` (None where it has none: plain PyTorch's apply)."""
        spec = self.frameworks.get(framework)
        if callable(spec):
            spec = spec(value)
        if spec is None:
            return None
        out = []
        for line in ([spec] if isinstance(spec, str) else spec):
            out += self.plain_lines(value, where) if line == PLAIN else [line.format(v=value, b=bool(value))]
        return out

    def own_option(self, framework: str, value) -> str | None:
        """The framework's own option that does it, code only (no comment); None where the framework has none
        or only places the plain lines somewhere (Lightning's configure_optimizers)."""
        spec = self.frameworks.get(framework)
        if callable(spec):
            spec = spec(value)
        if spec is None or PLAIN in ([spec] if isinstance(spec, str) else spec):
            return None
        first = spec if isinstance(spec, str) else spec[0]
        return first.format(v=value, b=bool(value)).split("  #")[0]

    def plain_lines(self, value, where: dict) -> list[str]:
        return list(self.pytorch(value, where)) if self.pytorch else []


PLAIN = "{plain PyTorch lines}"  # in a framework's lines: the plain PyTorch lines go here


def template(*lines: str) -> Callable[[object, dict], list]:
    """Plain PyTorch lines as templates: ``{v}`` the value, ``{b}`` it as a bool, ``{optimizer}`` the program's
    optimizer class, ``{at}`` a comment naming the DataLoader's line."""
    return lambda value, where: [ln.format(v=value, b=bool(value), **where) for ln in lines]
