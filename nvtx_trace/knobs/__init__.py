"""The registry of knobs: every module in this folder declares one ``KNOB``; nothing else lists them.

What `try` accepts, how a value is written and read, tune's loss bounds, which knobs change the arithmetic, the
math a configuration runs in, the framework's own option for a finding's fix and the lines that keep a knob are
all derived here, from the declarations (``knob.py``). Adding a knob is adding a module (docs/architecture.md).
Declarations of your own: ``NVTX_TRACE_KNOBS=pkg.my_knob,...`` names modules importable by both sides (the
command and the program), each declaring a ``KNOB``; they are applied by their own ``install(value, report)``.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil

from nvtx_trace.knobs.knob import APPLIED, PLAIN, Knob, template

EXTRA_ENV = "NVTX_TRACE_KNOBS"
FRAMEWORK_NAMES = {"hf_trainer": "Hugging Face Trainer", "lightning": "Lightning"}
PRECISIONS = ("fp32", "tf32", "bf16")  # the math a step's matrix work runs in, least to most
_found: dict = {}

__all__ = ["APPLIED", "EXTRA_ENV", "PLAIN", "Knob", "template", "registry", "get", "parse", "text", "from_json", "checked"]


def registry(strict: bool = True) -> dict[str, Knob]:
    """Name -> declaration, in declared order: this folder's modules and those ``$NVTX_TRACE_KNOBS`` names; a
    ValueError where one of those does not load, or (``strict=False``: what the analyzer reads) this folder's."""
    extra = os.environ.get(EXTRA_ENV, "")
    if extra not in _found:
        try:
            _found[extra] = _discover(extra)
        except ValueError:
            if strict or not extra:
                raise
            return registry_of_this_folder()
    return _found[extra]


def registry_of_this_folder() -> dict[str, Knob]:
    if "" not in _found:
        _found[""] = _discover("")
    return _found[""]


def _discover(extra: str) -> dict[str, Knob]:
    modules = [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__) if info.name != "knob"]
    modules += [m.strip() for m in extra.split(",") if m.strip()]
    found = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a declaration of the user's: say which and why
            raise ValueError(f"${EXTRA_ENV}: cannot import {name}: {exc}") from None
        knob = getattr(module, "KNOB", None)
        if not isinstance(knob, Knob):
            raise ValueError(f"{name} declares no KNOB (a nvtx_trace.knobs.Knob)")
        if knob.applied == "call" and knob.install is None and not name.startswith(__name__ + "."):
            raise ValueError(f"{name}: knob {knob.name} is applied by a call but declares no install(value, report)")
        found.append(knob)
    names = [k.name for k in found]
    if len(set(names)) != len(names):
        raise ValueError(f"two knobs share a name: {sorted({n for n in names if names.count(n) > 1})}")
    return {k.name: k for k in sorted(found, key=lambda k: (k.order, k.name))}


def check() -> None:
    """The declarations load ($NVTX_TRACE_KNOBS's included); a UsageError naming the one that does not."""
    from nvtx_trace.errors import UsageError

    try:
        registry()
    except ValueError as exc:
        raise UsageError(f"{exc}; fix it or unset ${EXTRA_ENV}") from None


def names() -> list[str]:
    return list(registry())


def get(name: str) -> Knob | None:
    return registry(strict=False).get(name)


def parse(text: str) -> dict:
    """``"amp=bf16,num_workers=8"`` -> ``{"amp": "bf16", "num_workers": 8}``; ValueError says what is wrong."""
    registry()  # a declaration of the user's that does not load is said, not taken for an unknown knob
    out: dict = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not value:
            raise ValueError(f"{part!r}: expected KNOB=VALUE")
        knob = get(key)
        if knob is None:
            raise ValueError(f"unknown knob {key!r} (known: {', '.join(names())})")
        value = knob.parse(value)
        if key in out and out[key] != value:
            raise ValueError(f"{key} given twice ({knob.text(out[key])} and {knob.text(value)}); give it once")
        out[key] = value
    return out


def text(knobs: dict) -> str:
    """The knobs as ``parse`` reads them (and as the user typed them)."""
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in knobs.items())


def to_json(knobs: dict) -> str:
    """What the program is told (``$NVTX_AUTOTRACE_TRY``): the values as they are, no text round trip."""
    return json.dumps(knobs, separators=(",", ":"))


def from_json(value: str) -> dict:
    """``$NVTX_AUTOTRACE_TRY`` read back: a JSON object (the runner's), or ``KNOB=VALUE,...`` (a user's)."""
    if not value.lstrip().startswith("{"):
        return parse(value)
    try:
        given = json.loads(value)
    except ValueError as exc:
        raise ValueError(f"not a JSON object of knobs: {exc}") from None
    return checked(given)


def checked(given: dict) -> dict:
    """Values as JSON carries them (the runner's request, the program's variable), each checked by its knob."""
    registry()
    if not isinstance(given, dict):
        raise ValueError(f"expected a JSON object of knobs, got {type(given).__name__}")
    out = {}
    for key, v in given.items():
        knob = get(key)
        if knob is None:
            raise ValueError(f"unknown knob {key!r} (known: {', '.join(names())})")
        out[key] = knob.check(v)
    return out


def loss_bound(knobs: dict) -> float:
    """How far the first losses may move with these knobs: the largest of their bounds."""
    return max(((get(k).loss_bound if get(k) else 0.01) for k in knobs), default=0.0)


def interact(knobs: dict, others: dict) -> bool:
    """Whether setting ``others`` (kept since a profile) can change what ``knobs`` fix, so that the profile says
    nothing true of them: they change the same part of a step, or one of them changes every part (its area is
    "graph" or unknown), or ``others`` changed the loader, whose pace, while it still binds, hides what any other
    knob saves (an H200 image classifier: amp 1.00x on 6 workers; the reverse holds, a loader setting after a
    precision setting needs no new profile)."""
    areas = {get(k).area if get(k) else "" for k in knobs}
    theirs = {get(k).area if get(k) else "" for k in others}
    if not areas or not theirs:
        return False
    return bool(areas & theirs or (areas | theirs) & {"", "graph"} or "loader" in theirs)


def numerics(knobs: dict) -> list[str]:
    """The knobs that change the program's arithmetic."""
    return sorted(k for k in knobs if get(k) is not None and get(k).numerics)


def for_tune(knobs: dict) -> dict:
    """The knobs tune and try --advice apply: none whose value the declaration refuses (amp=fp16 needs a
    GradScaler the program may not have)."""
    out = {}
    for k, v in knobs.items():
        knob = get(k)
        if knob is not None and not (knob.refused_by_tune and knob.refused_by_tune(v)):
            out[k] = v
    return out


def precision(knobs: dict) -> str | None:
    """The highest precision ``knobs`` make a step's matrix work run in (bf16 over tf32), None if none."""
    made = [p for k, v in knobs.items() if (knob := get(k)) and knob.precision and (p := knob.precision(v))]
    return max(made, key=PRECISIONS.index) if made else None


def observed(summary: dict) -> dict:
    """The values a report shows the knobs have (DataLoader workers per loader), for the history."""
    out = {}
    for knob in registry(strict=False).values():
        if knob.observed is not None:
            value = knob.observed(summary)
            if value is not None:
                out[knob.name] = value
    return out


# ---- the framework driving the loop: its own spelling of a knob -------------------------------------------

def framework_of(settings: dict | None) -> str:
    return ((settings or {}).get("framework") or {}).get("name") or "pytorch"


def sentence(settings: dict | None, knobs: dict) -> str:
    """ " In Lightning: Trainer(..., precision="bf16-mixed")." for a finding's knobs; "" where nothing applies."""
    framework = framework_of(settings)
    said = [o for k, v in knobs.items() if (knob := get(k)) and (o := knob.own_option(framework, v))]
    return f" In {FRAMEWORK_NAMES[framework]}: {'; '.join(said)}." if said and framework in FRAMEWORK_NAMES else ""


def where_of(settings: dict) -> dict:
    """What plain PyTorch lines name: the program's optimizer class, its DataLoader's line."""
    opt = ((settings.get("optimizers") or [{}])[0] or {}).get("class") or "AdamW"
    loader = ((settings.get("dataloaders") or [{}])[0] or {}).get("loader")
    return {"optimizer": opt, "at": f"  # the DataLoader at {loader}" if loader else ""}


def keep_lines(name: str, value, settings: dict) -> tuple[str, list[str]]:
    """(whose lines they are, the lines) that keep ``name=value``: the framework's own where it has them, else
    plain PyTorch's."""
    knob, framework, where = get(name), framework_of(settings), where_of(settings)
    if knob is None:
        return "pytorch", []
    own = knob.lines_in(framework, value, where)
    if own:
        return framework, own
    return "pytorch", knob.plain_lines(value, where)
