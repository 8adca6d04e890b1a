"""The house's rules, read from the code (issue 44): every import runs down the layers, none runs in a circle,
and no module name appears twice in the analyzer.

Layers, highest first: cli > runner > report > capture > analyzer and nvtx_autotrace > the ground floor (errors,
names, files: output-file safety, the fact table device_peaks and the knob declarations). Imports inside
functions count (a lazy import is still a dependency); those under ``if TYPE_CHECKING`` do not (never run)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from conftest import ROOT

LAYERS = {"cli": 5, "runner": 4, "report": 3, "capture": 2, "analyzer": 1}
GROUND = {"errors", "names", "files", "device_peaks", "knobs", "units", "labels"}


def modules() -> dict[str, Path]:
    out = {}
    for package in ("nvtx_trace", "nvtx_autotrace"):
        for f in sorted((ROOT / package).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] == "nvtx_autotrace":
        return 1
    if len(parts) == 1 or parts[1] in ("__main__",):
        return 6  # the package's entry points sit on top
    if parts[1] in GROUND:
        return 0
    return LAYERS.get(parts[1])


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """Every module of ours that ``name`` imports, at module level or inside a function."""
    out = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
                   for n in ast.walk(block)}  # names for annotations, never imported when the program runs
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets = []
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + [node.module])
            named = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets = named or [base]  # `from pkg import module` depends on the module, not on pkg
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                out.add(t)
    return out


REGISTRY = "nvtx_trace.analyzer.questions"


@functools.cache
def _parsed_graph() -> dict[str, frozenset[str]]:
    known = modules()
    g = {name: frozenset(imports_of(name, path, known)) for name, path in known.items()}
    g[REGISTRY] |= {m for m in known if m.startswith(REGISTRY + ".")}
    return g


def graph() -> dict[str, set[str]]:
    """Every module's imports; the registry also imports each question it discovers (``importlib``). Parsed once
    a session; each caller gets its own copy to plant imports in."""
    return {name: set(deps) for name, deps in _parsed_graph().items()}


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) is None] == []


def test_every_import_runs_down_the_layers():
    up = [f"{m} -> {i}" for m, deps in graph().items() for i in deps
          if layer(i) > layer(m) and not m.startswith(i + ".") and not (layer(m) == layer(i) == 1)]
    # a package's own __init__ re-exporting from below is no climb; nvtx_autotrace and analyzer share a floor
    assert up == []


def test_no_import_circle():
    g = graph()
    # a package imports its own submodules (its __init__ re-exports them): that edge is no circle
    g = {m: {i for i in deps if not i.startswith(m + ".")} for m, deps in g.items()}
    circles, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for i in sorted(g.get(m, ())):
            if state.get(i) == "open":
                circles.append(" -> ".join(path[path.index(i):] + [i]))
            elif i not in state:
                visit(i, path + [i])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert circles == []


# The analyzer's own floors (issue 54), lowest first: what a report holds; what ranks share and the figures
# questions share; the words every question speaks (a finding, a question, a prediction, the basis, the options);
# the questions; the framework that registers and runs them and writes their summary.
ANALYZER_FLOORS = {"trace": 0, "ranks": 1, "measures": 1, "findings": 2, "question": 2, "predict": 2, "basis": 2,
                   "options": 2, "questions": 3}


def analyzer_floor(name: str) -> int | None:
    parts = name.split(".")
    if parts[:2] != ["nvtx_trace", "analyzer"]:
        return None
    if name == REGISTRY or len(parts) == 2:
        return 4  # the registry and the package's entry point belong to the framework
    return ANALYZER_FLOORS.get(parts[2], 4)


def upward_in_the_analyzer(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {i}" for m, deps in g.items() if analyzer_floor(m) is not None for i in deps
                  if analyzer_floor(i) is not None and analyzer_floor(i) > analyzer_floor(m)
                  and not m.startswith(i + "."))


def test_the_analyzer_s_floors_hold():
    """trace < ranks, measures < the words questions use < questions < the framework: nothing imports upward,
    lazily or not, the registry's discovery included."""
    assert upward_in_the_analyzer(graph()) == []


def test_a_planted_upward_import_is_caught():
    g = graph()
    g["nvtx_trace.analyzer.trace.tables"] = g["nvtx_trace.analyzer.trace.tables"] | {"nvtx_trace.analyzer.pipeline"}
    g["nvtx_trace.analyzer.measures.step_times"] = g["nvtx_trace.analyzer.measures.step_times"] | {
        "nvtx_trace.analyzer.findings"}
    assert upward_in_the_analyzer(g) == ["nvtx_trace.analyzer.measures.step_times -> nvtx_trace.analyzer.findings",
                                         "nvtx_trace.analyzer.trace.tables -> nvtx_trace.analyzer.pipeline"]


# What a renderer may read of the analyzer (issue 54, "renderers render"): the analysis and its summary, the words
# a finding is told in, and the registry's reading order of the sections; never a measure, a trace table or a
# question module, whose figures reach a page only through the Analysis.
RENDERERS_READ = {"nvtx_trace.analyzer", "nvtx_trace.analyzer.analysis", "nvtx_trace.analyzer.summary",
                  "nvtx_trace.analyzer.findings", REGISTRY}


def renderers_reaching_in(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {i}" for m, deps in g.items() if m.startswith("nvtx_trace.report") for i in deps
                  if i.startswith("nvtx_trace.analyzer") and i not in RENDERERS_READ)


def test_renderers_read_the_analysis_not_its_measures():
    assert renderers_reaching_in(graph()) == []


def test_a_renderer_reaching_into_a_measure_is_caught():
    g = graph()
    g["nvtx_trace.report.timeline"] = g["nvtx_trace.report.timeline"] | {"nvtx_trace.analyzer.measures.gpu_idle"}
    assert renderers_reaching_in(g) == ["nvtx_trace.report.timeline -> nvtx_trace.analyzer.measures.gpu_idle"]


def test_no_module_name_twice_in_the_analyzer():
    names = [p.stem for p in (ROOT / "nvtx_trace" / "analyzer").rglob("*.py") if p.stem != "__init__"]
    names += [p.name for p in (ROOT / "nvtx_trace" / "analyzer").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_no_question_imports_another():
    """Shared figures go to measures/ (docs/architecture.md): a question that imports another one ties their
    order and their floors together. Lazy imports count, and the registry (the package) is no question's to import:
    what a question reads of the others comes through ``Context.questions``."""
    found = {f"{m} -> {i}" for m, deps in graph().items() if m.startswith(REGISTRY + ".")
             for i in deps if i == REGISTRY or i.startswith(REGISTRY + ".")}
    assert found == set()


def test_the_docs_needs_column_is_what_each_question_declares():
    """Issue 54: docs/architecture.md's "needs" column was wrong for 5 questions; it is read against the
    declarations (``Question.needs``; ranking runs after every question with findings)."""
    import importlib
    import pkgutil
    import re

    import nvtx_trace.analyzer.questions as questions

    rows = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        m = re.match(r"\| `questions/(\w+)\.py` \|", line)
        if m:
            rows[m.group(1)] = {w.strip() for w in line.strip().strip("|").split("|")[2].split(",") if w.strip()}
    wrong = {}
    for info in pkgutil.iter_modules(questions.__path__):
        q = getattr(importlib.import_module(f"{questions.__name__}.{info.name}"), "QUESTION", None)
        if q is None:
            continue
        declared = set(q.needs) | ({"every question with findings"} if q.after_findings else set())
        if rows.get(info.name) != declared:
            wrong[info.name] = (rows.get(info.name), declared)
    assert wrong == {}


def test_no_module_over_450_lines():
    """Issue 54: a module that grows past this holds two questions; split it along its seam."""
    assert {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 450} == {}
