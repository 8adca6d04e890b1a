"""The registry of questions: every module in this folder declares one ``QUESTION``; nothing else lists them.

The order questions run in, the order findings are built in, the thresholds, the idle kinds predictions
read, the summary.json key order and the terminal and HTML sections are all derived here, from the
declarations. Adding a question is adding a module (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import pkgutil

from nvtx_trace.analyzer import findings
from nvtx_trace.analyzer import question as declared
from nvtx_trace.analyzer.question import Question

# summary.json's keys that no question owns: the report's own, first, and the notes on it, last
HEAD_KEYS = ("schema_version", "tool", "report")
TAIL_KEYS = ("skipped", "warnings")


def _discover() -> list[Question]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        question = getattr(module, "QUESTION", None)
        if not isinstance(question, Question):
            raise TypeError(f"{module.__name__} declares no QUESTION")
        found.append(question)
    names = [q.name for q in found]
    if len(set(names)) != len(names):
        raise ValueError(f"two questions share a name: {sorted(n for n in names if names.count(n) > 1)}")
    return sorted(found, key=lambda q: (q.order, q.name))


REGISTRY: list[Question] = _discover()


def thresholds() -> dict:
    """Every question's thresholds, by name (a name declared twice must agree)."""
    out: dict = {}
    for q in REGISTRY:
        for k, v in q.thresholds.items():
            if k in out and out[k] != v:
                raise ValueError(f"threshold {k!r} declared twice with different values")
            out[k] = v
    return out


findings.THRESHOLDS.use(thresholds)  # the registry fills the mapping: findings imports no question


def idle_kinds() -> tuple[str, ...]:
    return declared.kinds(REGISTRY, "idle_kinds")


def host_kinds() -> frozenset[str]:
    return frozenset(declared.kinds(REGISTRY, "host_kinds"))


def prediction_rules() -> dict:
    """Finding kind -> the rule its question predicts its fix by (``Question.predicts``)."""
    return declared.prediction_rules(REGISTRY)


def knobs_of(finding: dict, kept: dict | None = None) -> dict:
    """The knobs `try` applies for a finding's fix, beyond those ``kept`` already at that value (tune's
    configuration so far): its question's rule (``Question.knobs``) over the knobs its ``recommend`` names."""
    from nvtx_trace import knobs as declared

    kept = kept or {}
    rule = next((q.knobs[finding.get("kind")] for q in REGISTRY if finding.get("kind") in q.knobs), None)
    named = {k: v for k, v in (finding.get("recommend") or {}).items() if declared.get(k) is not None and kept.get(k) != v}
    out = rule(finding, named) if rule is not None else named
    more = (finding.get("predicted") or {}).get("with_workers")  # the loader's pace holds the fix back
    if out and more and "num_workers" not in out and (kept.get("num_workers") or 0) < more["workers"]:
        out = {**out, "num_workers": more["workers"]}  # the fix comes with the workers that keep up with it
    return {k: v for k, v in out.items() if kept.get(k) != v}


def json_key_order() -> tuple[str, ...]:
    ordered = sorted((q for q in REGISTRY if q.json_keys), key=lambda q: (_at(q, "json_at"), q.name))
    return HEAD_KEYS + tuple(k for q in ordered for k in q.json_keys) + TAIL_KEYS


def text_sections() -> list[Question]:
    return sorted((q for q in REGISTRY if q.text is not None), key=lambda q: (_at(q, "text_at"), q.name))


def html_sections() -> list[Question]:
    return sorted((q for q in REGISTRY if q.html is not None), key=lambda q: (_at(q, "html_at"), q.name))


def _at(q: Question, which: str) -> int:
    at = getattr(q, which)
    return q.order if at is None else at
