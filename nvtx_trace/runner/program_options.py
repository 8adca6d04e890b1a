"""The program's own options that do what a knob does: the levers ``tune`` tries first, since they are what a user
keeps (issue 51).

Read, never run: the script's ``add_argument`` calls (its flags, action, type, default, choices and help, found in
its syntax tree, any parser or group), and a nanoGPT-style configurator (module-level constants that ``--key=value``
overrides, where the script ``exec``\\ s a configurator file). An option maps to a knob by its name, against the
knob's ``option_words`` (``--workers`` -> num_workers, ``--pin-mem`` -> pin_memory, ``--flash`` -> sdpa,
``--dtype`` with a bfloat16 choice -> amp); a trial of it changes the command line only. Never an option that
changes what is trained: only options named by a knob's words map, and the losses' bound judges every trial.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from nvtx_trace import knobs as declared


@dataclass(frozen=True)
class Option:
    """One option of the program's command line, as its source declares it."""

    flags: tuple  # ("-j", "--workers"), or ("--compile",) for a configurator global
    kind: str  # "switch" (store_true), "negatable" (--x/--no-x), "value" (takes one), "global" (--key=value);
    # "negative" (store_false: maps to nothing), "enable" (a switch that turns on what another option chooses)
    type: str | None  # "int", "float", "str", "bool", or None where the source does not say
    default: object = None
    choices: tuple = ()
    help: str = ""
    current: object = None  # what the program's command line sets it to (with_current); None: its default
    known: bool = True  # False: a file the command names may set it (nanoGPT's config/*.py): its value is unknown

    @property
    def value(self):
        """What the program runs with: the command line's value, else the default."""
        return self.current if self.current is not None else self.default

    @property
    def flag(self) -> str:
        """The long flag, as the user types it."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    @property
    def name(self) -> str:
        return words_of(self.flag)


def words_of(flag: str) -> str:
    """``--pin-mem`` -> ``pin_mem``: how option names and a knob's words are compared."""
    return flag.lstrip("-").replace("-", "_").lower()


def read(script: Path | None) -> list[Option]:
    """The options the script declares; [] for no script, an unreadable one, or one that does not parse."""
    if script is None:
        return []
    try:
        source = Path(script).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return []
    out = [o for node in ast.walk(tree) if (o := _argument(node)) is not None]
    if "configurator" in source and re.search(r"exec\s*\(\s*open\s*\(", source):
        out += _configurator_globals(tree)
    if "HfArgumentParser" in source and "TrainingArguments" in source:
        out += HF_TRAINING_ARGUMENTS
    if "LightningCLI" in source:
        out += LIGHTNING_CLI
    seen, unique = set(), []
    for o in out:
        if o.flag not in seen:
            seen.add(o.flag)
            unique.append(o)
    return unique


def _constant(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _arithmetic(node)


def _arithmetic(node):
    """``5 * 8`` (nanoGPT's gradient_accumulation_steps): whole numbers multiplied, added or subtracted."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub)):
        a, b = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
            return a * b if isinstance(node.op, ast.Mult) else a + b if isinstance(node.op, ast.Add) else a - b
        return None
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _argument(node) -> Option | None:
    """An ``x.add_argument("--flag", ...)`` call as an Option (positional arguments are not options)."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return None
    flags = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    if not flags or not all(f.startswith("-") for f in flags):
        return None
    kw = {k.arg: k.value for k in node.keywords if k.arg}
    action = kw.get("action")
    action_name = (action.value if isinstance(action, ast.Constant) else
                   getattr(action, "attr", getattr(action, "id", None)) if action is not None else None)
    type_node = kw.get("type")
    type_name = getattr(type_node, "id", getattr(type_node, "attr", None)) if type_node is not None else None
    default = _constant(kw["default"]) if "default" in kw else None
    choices = _constant(kw["choices"]) if "choices" in kw else None
    help_text = _constant(kw["help"]) if "help" in kw else ""
    if action_name in ("store_true", "store_false"):
        kind, type_name = ("switch" if action_name == "store_true" else "negative"), "bool"
        default = action_name == "store_false" if default is None else default
    elif action_name == "BooleanOptionalAction":
        kind, type_name = "negatable", "bool"
    elif action_name in ("count", "append", "store_const", "append_const", "help", "version", "extend"):
        return None
    else:
        kind = "value"
        if type_name not in ("int", "float", "str", "bool"):
            type_name = type(default).__name__ if isinstance(default, (bool, int, float, str)) else type_name
    return Option(flags, kind, type_name, default, tuple(choices) if isinstance(choices, (list, tuple)) else (),
                  help_text if isinstance(help_text, str) else "")


def _configurator_globals(tree) -> list[Option]:
    """nanoGPT's way: module-level constants (``compile = True``), each overridable as ``--compile=False``."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _constant(node.value)
            if isinstance(value, (bool, int, float, str)) and not node.targets[0].id.startswith("_"):
                out.append(Option((f"--{node.targets[0].id}",), "global", type(value).__name__, value))
    return out


# A script that parses Hugging Face's TrainingArguments with HfArgumentParser takes each field as an option of its
# name: the fields that do what a knob does (transformers' TrainingArguments, its public API; a bool field is
# ``--bf16`` or ``--bf16 True``, one whose default is True also ``--no_<name>``; ``optim`` lists its optimizers).
HF_TRAINING_ARGUMENTS = [
    Option(("--bf16",), "switch", "bool", False),
    Option(("--tf32",), "value", "bool", None),  # Optional[bool]: HfArgumentParser wants its value (--tf32 True)
    Option(("--torch_compile",), "switch", "bool", False), Option(("--torch_compile_mode",), "value", "str", None),
    Option(("--dataloader_num_workers",), "value", "int", 0),
    Option(("--dataloader_pin_memory",), "switch", "bool", True),  # on by default
    Option(("--dataloader_persistent_workers",), "switch", "bool", False),
    Option(("--dataloader_prefetch_factor",), "value", "int", None),
    Option(("--optim",), "value", "str", "adamw_torch", ("adamw_torch", "adamw_torch_fused", "adafactor", "sgd")),
    Option(("--per_device_train_batch_size",), "value", "int", 8),
    Option(("--gradient_accumulation_steps",), "value", "int", 1),
]
# A LightningCLI script takes the Trainer's arguments as --trainer.<name> (jsonargparse).
LIGHTNING_CLI = [
    Option(("--trainer.precision",), "value", "str", "32-true",
           ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true")),
    Option(("--trainer.benchmark",), "value", "bool", None),
]


@dataclass(frozen=True)
class Lever:
    """An option that does what ``knob`` does."""

    option: Option
    knob: str

    partner: Option | None = None  # the option that moves against it (knob.option_with: accumulation steps)

    def words(self, value) -> list[str] | None:
        """The command-line words that set the knob to ``value`` through this option; None where it cannot (a
        switch cannot say False, nor a number a mode), or where the option gives that value by default."""
        o, knob = self.option, declared.get(self.knob)
        if knob is None:
            return None
        if self.partner is not None:
            return self._folded(value)
        if o.kind == "switch":
            named = {words_of(w) for w, v in knob.choices.items() if v == value}  # --bf16: a switch named by it
            on = value is True or (isinstance(value, str) and o.name in named)
            return [o.flag] if on and not o.value else None
        if o.kind == "negatable":
            if not isinstance(value, bool) or bool(o.value) == value:
                return None
            return [o.flag if value else "--no-" + o.flag[2:]]
        if o.kind not in ("value", "global"):
            return None
        text = self._text(knob, value)
        if text is None or str(o.value) == text:
            return None
        return [f"{o.flag}={text}"] if o.kind == "global" else [o.flag, text]

    def _folded(self, factor) -> list[str] | None:
        """Option x factor, its partner / factor (a micro-batch and its accumulation steps), from their values on
        the command line or their defaults; None where the partner does not divide."""
        if not (self.option.known and self.partner.known):
            return None
        mb, acc = self.option.value, self.partner.value
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (mb, acc, factor)):
            return None
        if factor < 2 or acc % factor:
            return None
        return [w for o, v in ((self.option, mb * factor), (self.partner, acc // factor))
                for w in ([f"{o.flag}={v}"] if o.kind == "global" else [o.flag, str(v)])]

    def _text(self, knob, value) -> str | None:
        """The option's own word for the value: a number, one of its choices (``bfloat16``, a compile mode), or
        a boolean in the form its default has."""
        o = self.option
        if knob.value is int:
            return str(value) if o.type in ("int", None) and not isinstance(o.value, bool) else None
        if isinstance(value, str):  # a word (amp's bf16, compile's mode): one of the option's own words for it
            if o.choices:
                words = [str(c) for c in o.choices]
            elif isinstance(o.value, str) or (o.value is None and o.type == "str"):  # no choices: the knob's
                words = sorted(knob.choices, key=lambda w: ("float" in w) != ("float" in (o.value or "")))
            else:
                return None
            return next((w for w in words if knob.choices.get(w.lower(), w) == value), None)
        if o.choices and isinstance(o.value, str):  # --attn manual|sdpa: the choice named by the knob's words
            wanted = {words_of(w) for w in knob.option_words}
            return next((str(c) for c in o.choices if words_of(str(c)) in wanted), None) if value else None
        if o.type == "int" or (isinstance(o.value, int) and not isinstance(o.value, bool)):
            return "1" if value else "0"
        if o.type == "bool" or isinstance(o.value, bool) or (o.type is None and o.value is None):
            return "True" if value else "False"
        if isinstance(o.value, str) and o.value.lower() in ("true", "false"):
            word = "true" if value else "false"
            return word.capitalize() if o.value[0].isupper() else word
        return None


def levers(options: list[Option]) -> dict[str, list[Lever]]:
    """Knob -> the options that do what it does (amp's can be two: timm's ``--amp`` and ``--amp-dtype``)."""
    out: dict[str, list[Lever]] = {}
    for knob in declared.registry().values():
        if knob.option_with:
            paired = _paired(knob, options)
            if paired:
                out[knob.name] = [paired]
            continue
        wanted = {words_of(w) for w in knob.option_words}
        enables = {words_of(w) for w in knob.option_enables}
        choosers = {words_of(w) for w in knob.option_choosers}
        for o in options:
            if o.name in wanted or (o.name in choosers and any(words_of(str(c)) in wanted for c in o.choices)):
                out.setdefault(knob.name, []).append(Lever(o, knob.name))
            elif o.name in enables and o.kind == "switch":  # it turns the setting on; another option says how
                out.setdefault(knob.name, []).append(Lever(dataclasses.replace(o, kind="enable"), knob.name))
    return out


def _paired(knob, options: list[Option]) -> Lever | None:
    """The knob's option and the one that moves against it (knob.option_with), both whole numbers, or None."""
    def first(words) -> Option | None:
        wanted = [words_of(w) for w in words]
        found = [o for o in options if o.name in wanted and o.kind in ("value", "global") and o.type == "int"]
        return min(found, key=lambda o: wanted.index(o.name)) if found else None

    main, partner = first(knob.option_words), first(knob.option_with)
    return Lever(main, knob.name, partner) if main and partner else None


def with_current(options: list[Option], program: list[str]) -> list[Option]:
    """The options with the values the program's command line gives them (``current``): what a trial moves from
    (a micro-batch folded from ``--micro-batch 32``, not from the default). A long flag may be abbreviated, as
    argparse allows (``--batch 32`` for ``--batch-size``). A nanoGPT-style script given a config file may set any
    of its globals there: those are unknown."""
    at = script_index(program)
    if at is None:
        return list(options)
    longs = [f for o in options for f in o.flags if f.startswith("--")]
    args = [_unabbreviated(w, longs) for w in program[at + 1:]]
    config_file = any(not w.startswith("-") and w.endswith(".py") for w in args)
    out = []
    for o in options:
        given = _given(o, args)
        o = o if given is None else dataclasses.replace(o, current=given)
        out.append(dataclasses.replace(o, known=False) if o.kind == "global" and config_file else o)
    return out


def _unabbreviated(word: str, longs: list[str]) -> str:
    """``--batch=32`` -> ``--batch-size=32`` where exactly one long flag starts so (argparse's allow_abbrev)."""
    if not word.startswith("--") or word == "--":
        return word
    flag, eq, rest = word.partition("=")
    if flag in longs:
        return word
    matches = {f for f in longs if f.startswith(flag)}
    return (matches.pop() + eq + rest) if len(matches) == 1 else word


def _given(o: Option, args: list[str]):
    value = None
    for i, w in enumerate(args):
        for f in o.flags:
            if o.kind in ("switch", "enable") and w == f:  # HF's bools also take a word: --bf16 False
                following = args[i + 1].lower() if i + 1 < len(args) else ""
                value = following not in ("false", "0", "no") if following in (
                    "true", "false", "1", "0", "yes", "no") else True
            elif o.kind == "negatable" and w in (f, "--no-" + f[2:]):
                value = w == f
            elif o.kind in ("value", "global") and w.startswith(f + "="):
                value = typed(o, w[len(f) + 1:])
            elif o.kind == "value" and w == f and i + 1 < len(args):
                value = typed(o, args[i + 1])
            elif o.kind == "value" and len(f) == 2 and w.startswith(f) and len(w) > 2:
                value = typed(o, w[2:])
    return value


def typed(o: Option, text: str):
    """The option's value from its text, as its declared type reads it (None where it does not)."""
    if o.type == "int":
        try:
            return int(text)
        except ValueError:
            return None
    if o.type == "float":
        try:
            return float(text)
        except ValueError:
            return None
    if o.type == "bool":
        return text.strip().lower() in ("1", "true", "yes", "on")
    return text


def words_for(found: dict[str, list[Lever]], knob: str, value) -> list[str] | None:
    """Every word that sets ``knob=value`` through the program's options, or None where none can; with the switch
    that turns the setting on where the knob names one (timm's ``--amp`` beside ``--amp-dtype bfloat16``)."""
    said = [w for lever in found.get(knob, []) if lever.option.kind != "enable" and (w := lever.words(value))]
    if not said:
        return None
    enable = [[lever.option.flag] for lever in found.get(knob, []) if lever.option.kind == "enable"
              and not lever.option.default]
    return [x for w in said + enable for x in w]


def script_index(program: list[str]) -> int | None:
    """Where the script's path is in the program (its options follow it); None for a module or a command."""
    return next((i for i, w in enumerate(program) if w.endswith(".py")), None)


def with_words(program: list[str], options: list[Option], words: list[str]) -> list[str]:
    """The program with ``words`` set: each option they name is removed from the script's arguments first (in any
    of its spellings: ``--workers 2``, ``--workers=2``, ``-j 2``, ``-j2``), then the words are appended."""
    at = script_index(program)
    if at is None:
        return list(program)
    head, args = program[:at + 1], list(program[at + 1:])
    named = [o for o in options if any(w == f or w.startswith(f + "=") for w in words for f in o.flags)]
    for o in named:
        negative = ["--no-" + f[2:] for f in o.flags if f.startswith("--")] if o.kind == "negatable" else []
        args = _without(args, o, negative)
    return head + args + list(words)


def _without(args: list[str], o: Option, negative: list[str]) -> list[str]:
    out, i = [], 0
    takes_value = o.kind == "value"
    while i < len(args):
        w = args[i]
        if w in o.flags or w in negative:
            word_follows = (o.kind in ("switch", "enable") and i + 1 < len(args)
                            and args[i + 1].lower() in ("true", "false", "1", "0", "yes", "no"))  # --bf16 False
            i += 2 if (takes_value or word_follows) and w in o.flags and i + 1 < len(args) else 1
            continue
        if any(w.startswith(f + "=") for f in o.flags) or any(
                len(f) == 2 and takes_value and w.startswith(f) and len(w) > 2 for f in o.flags):
            i += 1
            continue
        out.append(w)
        i += 1
    return out
