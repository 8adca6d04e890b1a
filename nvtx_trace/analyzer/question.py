"""The declaration every analysis makes: one ``Question`` per module in ``analyzer/questions/``.

A question says what it reads (``launches``: its requests of the runtime table, made before anything is
read), which other questions' results it needs, how it computes (``run``), its thresholds, its findings,
its summary.json keys, its notebook tables, and what it shows (terminal lines, HTML tables). Everything
that must agree across the tool (the order questions run in, the order of findings, the thresholds, the
JSON key order, the terminal and HTML sections) is derived from these declarations by
``questions.REGISTRY``; docs/architecture.md has the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # named in annotations only: the analysis imports this module
    from nvtx_trace.analyzer.analysis import Analysis
    from nvtx_trace.analyzer.trace.reader import Reader
    from nvtx_trace.analyzer.trace.tables import Trace


@dataclass
class Context:
    """What every question may read: the trace, the report's reader, the options, and results so far."""

    trace: Trace
    reader: Reader
    result: Analysis  # filled question by question
    min_gap_ns: int
    loader_pattern: str
    warmup_steps: int | None
    step_range: str | None = None  # --step-range: the user's own ranges that are the steps
    questions: tuple = ()  # every question of this analysis (set by the pipeline): what ranking reads of the others


@dataclass(frozen=True)
class Question:
    name: str  # its result: analysis.<name>
    order: int  # where it runs among questions its needs allow, and where its findings are built
    run: Callable[[Context], None] | None = None
    needs: tuple[str, ...] = ()  # questions whose results it reads
    after_findings: bool = False  # it also needs every question that builds findings
    results: dict = field(default_factory=dict)  # other Analysis attributes it sets, with their value when unset
    launches: Callable[[Any], tuple | None] | None = None  # Trace -> the GPU ops whose launching calls it reads
    announce: Callable[[Any], None] | None = None  # (Trace) -> None: asks for more from the one pass per table
    thresholds: dict = field(default_factory=dict)  # its own, merged into findings.THRESHOLDS
    findings: Callable | None = None  # (Analysis, Basis) -> list[Finding]; Basis: the figures findings share
    idle_kinds: tuple[str, ...] = ()  # its finding kinds whose impact is GPU time lost idle in the window
    work_kinds: tuple[str, ...] = ()  # its finding kinds whose impact is GPU work: it shortens a GPU-bound step only
    host_kinds: tuple[str, ...] = ()  # its finding kinds whose idle the tool's own CPU time lengthens (try's
    # plain runs show that cost, and take it out of their saving)
    predicts: dict = field(default_factory=dict)  # kind -> (Analysis, Finding) -> predicted, once all are built
    knobs: dict = field(default_factory=dict)  # kind -> (finding dict) -> the knobs `try` applies for its fix
    json_keys: tuple[str, ...] = ()  # the summary.json keys it owns, in its order (docs/json-schema.md)
    json_at: int | None = None  # where its keys sit in summary.json (default: order)
    to_json: Callable[[Any], dict] | None = None  # Analysis -> {key: value} for json_keys
    tables: Callable[[Any], dict] | None = None  # Analysis -> {name: DataFrame} for notebooks
    text: Callable | None = None  # (Analysis, TextView) -> None: its terminal lines
    text_at: int | None = None  # where they sit in the terminal report (default: order)
    html: Callable | None = None  # (Analysis, summary dict, HtmlView) -> HTML of its tables ("" when none)
    html_at: int | None = None  # where they sit in the page's Details (default: order)


def kinds(questions, attr: str) -> tuple[str, ...]:
    """The finding kinds a list of questions declares under ``attr`` (idle_kinds, work_kinds, host_kinds)."""
    return tuple(k for q in questions for k in getattr(q, attr))


def prediction_rules(questions) -> dict:
    """Finding kind -> the rule its question predicts its fix by (``Question.predicts``)."""
    return {k: rule for q in questions for k, rule in q.predicts.items()}
