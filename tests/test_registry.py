"""The registry of questions is the one list: a question declared in one place reaches every output, and
only the reader knows the export's schema."""

from __future__ import annotations

import importlib
import io
import pkgutil
import re

import pytest
from conftest import ROOT, SAMPLES
from rich.console import Console

from nvtx_trace.analyzer import analyze, questions
from nvtx_trace.analyzer.findings import THRESHOLDS, Finding
from nvtx_trace.analyzer.pipeline import ordered
from nvtx_trace.analyzer.question import Question
from nvtx_trace.analyzer.summary import to_dict
from nvtx_trace.report import html, text

REPORT = SAMPLES / "resnet_flawed_user.sqlite"


def test_every_module_in_the_folder_is_one_registered_question():
    modules = [m.name for m in pkgutil.iter_modules(questions.__path__)]
    assert len(modules) == len(questions.REGISTRY) == len({q.name for q in questions.REGISTRY})
    # each runs after what it needs; the findings are ranked after every question that builds them
    names = [q.name for q in ordered(questions.REGISTRY)]
    for q in questions.REGISTRY:
        assert all(names.index(n) < names.index(q.name) for n in q.needs)
    assert all(names.index(q.name) < names.index("findings") for q in questions.REGISTRY if q.findings)


def _probe(a) -> list[Finding]:
    if a.probe is None:
        return []
    return [Finding(kind="probe_kind", title="probe finding", impact_ns=10**12, fix="probe fix",
                    threshold=f">= {THRESHOLDS['probe_threshold']}")]


PROBE = Question(
    name="probe", order=55, run=lambda ctx: setattr(ctx.result, "probe", {"answer": 42}), needs=("idle",),
    thresholds={"probe_threshold": 7}, findings=lambda a, basis: _probe(a), idle_kinds=("probe_kind",),
    json_keys=("probe_section",), json_at=85, to_json=lambda a: {"probe_section": a.probe},
    text=lambda a, view: view.print("probe text line"), text_at=35,
    html=lambda a, d, view: f"<h3>probe html {d['probe_section']['answer']}</h3>", html_at=25,
)


@pytest.fixture
def registered_probe(monkeypatch):
    """A question added the way a module in analyzer/questions/ adds one, and nothing else edited."""
    monkeypatch.setattr(THRESHOLDS, "_all", None)  # re-derived with the probe's
    questions.REGISTRY.append(PROBE)
    questions.REGISTRY.sort(key=lambda q: (q.order, q.name))
    yield
    questions.REGISTRY.remove(PROBE)
    THRESHOLDS._all = None


def test_a_registered_question_reaches_every_output(registered_probe):
    a = analyze(REPORT)
    assert a.probe == {"answer": 42}
    assert THRESHOLDS["probe_threshold"] == 7 and "probe_kind" in questions.idle_kinds()
    assert a.findings[0].kind == "probe_kind" and a.findings[0].threshold == ">= 7"  # ranked by its impact
    d = to_dict(a)
    keys = list(d)
    assert keys.index("probe_section") == keys.index("transposes") + 1  # json_at 85: after layout's 80
    out = io.StringIO()
    text.render(a, Console(file=out, width=200, color_system=None))
    lines = out.getvalue().splitlines()
    assert "probe text line" in lines
    assert "<h3>probe html 42</h3>" in html.render(a, max_points=200)


def test_a_new_question_adds_its_own_snapshot_and_changes_no_other_question_s(registered_probe):
    """Issue 44: a question added as a module adds and changes: its own snapshot part, and where its finding ranks
    (the ranking's kind order) and shows (the page's findings, in the frame); every other question's part of
    every output stays as recorded."""
    from golden_compare import differences
    from question_snapshots import FRAME, parts_of, recorded
    from question_snapshots import SAMPLES as SNAPSHOT_SAMPLES

    for report in SNAPSHOT_SAMPLES[:2]:
        a = analyze(report)
        probe = [f for f in to_dict(a)["findings"] if f["kind"] == "probe_kind"]
        got, want = parts_of(report, a), recorded(report.stem)
        assert got["probe"] == {"json": {"probe_section": {"answer": 42}}, "findings": probe,
                                "text": "probe text line\n", "html_sha256": got["probe"]["html_sha256"]}
        changed = sorted(name for name in want if differences(got[name], want[name]))
        assert changed == sorted(["findings", FRAME]), changed  # the rank order; the page's findings list
        ranked = got["findings"]["json"]["findings"]
        assert [k for k in ranked if k != "probe_kind"] == want["findings"]["json"]["findings"]


def test_the_outputs_follow_the_declared_orders():
    keys = questions.json_key_order()
    assert keys[:3] == questions.HEAD_KEYS and keys[-2:] == questions.TAIL_KEYS
    assert list(to_dict(analyze(REPORT))) == [k for k in keys if k not in ("clock", "ranks")]
    assert len(keys) == len(set(keys))  # no key owned twice


SCHEMA_WORDS = re.compile(r"\bSELECT\b|\bPRAGMA\b|\bJOIN\b|CUPTI_ACTIVITY|NVTX_EVENTS|StringIds|\bENUM_CUDA|"
                          r"TARGET_INFO|ANALYSIS_DETAILS|\bglobalPid\b|\bcorrelationId\b|\bshortName\b|"
                          r"\bdemangledName\b|\.conn\.")


@pytest.mark.parametrize("package", ["analyzer", "cli"])
def test_only_the_reader_knows_the_export_schema(package):
    """SQL text, table and column names of the export, and raw connections live in analyzer/trace/reader.py alone
    (with export_db.py, its SQLite side), and in analyzer/trace/opening.py, which opens the file for it (the capture
    side's export checks, redact and the history database are not analyses of a report)."""
    offenders = []
    for path in sorted((ROOT / "nvtx_trace" / package).rglob("*.py")):
        if path.name in ("reader.py", "export_db.py", "opening.py"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if SCHEMA_WORDS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_architecture_doc_lists_every_question():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for q in questions.REGISTRY:
        assert f"`questions/{_module_of(q)}.py`" in doc, q.name


def _module_of(q: Question) -> str:
    for m in pkgutil.iter_modules(questions.__path__):
        if importlib.import_module(f"nvtx_trace.analyzer.questions.{m.name}").QUESTION is q:
            return m.name
    raise AssertionError(q.name)



def test_the_json_schema_has_one_section_per_question_with_its_keys_and_finding_kinds():
    """docs/json-schema.md, one section per question (issue 44): a question that writes keys or raises findings has
    its `### `name` (questions/module.py)` section, holding each of its keys; every kind the samples raise is
    described in the section of the question that raised it."""
    from conftest import sample_analysis
    from question_snapshots import SAMPLES as SNAPSHOT_SAMPLES

    doc = (ROOT / "docs" / "json-schema.md").read_text()
    found = re.findall(r"^### `(\w+)` \(questions/(\w+)\.py\)\n(.*?)(?=^### |^## |\Z)", doc, re.M | re.S)
    sections = {name: body for name, _module, body in found}
    modules = {name: module for name, module, _body in found}
    for q in questions.REGISTRY:
        if q.json_keys or q.findings is not None:
            assert q.name in sections and modules[q.name] == _module_of(q), q.name
            for key in q.json_keys:
                assert f"`{key}" in sections[q.name], (q.name, key)
    raised = {}
    for report in SNAPSHOT_SAMPLES:
        raised.update(sample_analysis(report).raised_by)
    for kind, name in raised.items():
        assert f"`{kind}`" in sections[name], (kind, name)


def test_thresholds_read_before_the_registry_are_read_again_once_it_plugs_in():
    """findings imports no question: the registry plugs its thresholds in; a read before that (the common ones only)
    is not kept once it does."""
    from nvtx_trace.analyzer.findings import COMMON_THRESHOLDS, _Thresholds

    early = _Thresholds()
    assert dict(early) == COMMON_THRESHOLDS
    early.use(questions.thresholds)
    assert dict(early) == {**COMMON_THRESHOLDS, **questions.thresholds()} and "pageable_min_bytes" in early
