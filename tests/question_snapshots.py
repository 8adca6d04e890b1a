"""Each question's own snapshot of every sample report (tests/golden_questions/<question>.json): its summary.json
keys, the findings it raised, its terminal lines and the digest of its HTML part; ``_frame.json`` holds what no
question owns (the summary's head and tail keys, the terminal's header and notes, the page without the
questions' parts). A new question adds its own file and changes no other but where its findings rank
(the ranking question's ``findings``: the order of the kinds) and show (the page's findings). No pytest here: the tests and
``--update`` share it.

    python tests/question_snapshots.py --update && git diff tests/golden_questions
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "golden_questions"
SAMPLES = sorted((ROOT / "sample_reports").glob("*.sqlite"))
FRAME = "_frame"
WIDTH = 120  # the terminal's columns in the snapshots


def _summary(report: Path, a) -> dict:
    from nvtx_trace.analyzer.summary import to_dict

    out = json.loads(json.dumps(to_dict(a)))
    out["report"]["path"] = report.name  # where the checkout lives is not a figure
    out["tool"]["version"] = None
    return out


def _printed(report: Path, draw) -> str:
    from rich.console import Console

    out = io.StringIO()
    draw(Console(file=out, width=WIDTH, color_system=None))
    return out.getvalue().replace(str(report), report.name)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parts_of(report: Path, a) -> dict[str, dict]:
    """Every question's part of one sample's outputs, and the frame."""
    from plotly.offline import get_plotlyjs

    from nvtx_trace import __version__
    from nvtx_trace.analyzer.questions import HEAD_KEYS, REGISTRY, TAIL_KEYS, html_sections, text_sections
    from nvtx_trace.analyzer.summary import to_dict
    from nvtx_trace.report import html, text
    from nvtx_trace.report.sections import HtmlView, TextView

    a.path = report.name  # as the terminal snapshots always showed it
    d = _summary(report, a)
    parts: dict[str, dict] = {q.name: {} for q in REGISTRY}
    for q in REGISTRY:
        if q.json_keys:
            parts[q.name]["json"] = {k: d[k] for k in q.json_keys if k in d}
    kinds = [f["kind"] for f in d.get("findings", [])]
    for f in d.get("findings", []):  # in rank order (a kind may come twice: cpu_overhead per cause)
        parts[a.raised_by[f["kind"]]].setdefault("findings", []).append(f)
    if "findings" in d:  # the ranking question's key: the rank order; each finding is its raiser's
        parts[next(q.name for q in REGISTRY if "findings" in q.json_keys)]["json"]["findings"] = kinds
    for q in text_sections():
        lines = _printed(report, lambda c, q=q: q.text(a, TextView(c)))
        if lines:
            parts[q.name]["text"] = lines
    raw = to_dict(a)
    page = html.render(a)
    for q in html_sections():
        part = q.html(a, raw, HtmlView)
        if part:
            parts[q.name]["html_sha256"] = _digest(part)
            page = page.replace(part, "", 1)
    page = page.replace(get_plotlyjs().replace("</script", "<\\/script"), "PLOTLY_JS")
    page = page.replace(f"nvtx-trace {__version__}", "nvtx-trace VERSION")
    whole = _printed(report, lambda c: text.render(a, c))
    sections = "".join(parts[q.name].get("text", "") for q in text_sections())
    assert sections in whole  # each question's lines, printed alone, are what the whole report prints
    head, _, tail = whole.partition(sections) if sections else (whole.split("\n", 1)[0] + "\n", "",
                                                                 whole.split("\n", 1)[1])
    parts[FRAME] = {"json": {k: d[k] for k in (*HEAD_KEYS, *TAIL_KEYS) if k in d}, "text_head": head,
                    "text_tail": tail, "html_sha256": _digest(page)}
    return {name: part for name, part in parts.items()}


def recorded(stem: str) -> dict[str, dict]:
    """One sample's recorded parts, by question (and the frame)."""
    return {f.stem: json.loads(f.read_text()).get(stem, {}) for f in sorted(SNAPSHOTS.glob("*.json"))}


def recorded_summary(stem: str) -> dict:
    """The sample's whole summary.json, put together from the parts in summary.json's key order."""
    from nvtx_trace.analyzer.questions import json_key_order

    parts = recorded(stem)
    merged: dict = {}
    for part in parts.values():
        merged.update(part.get("json", {}))
    if "findings" in merged:  # each kind's findings, in rank order, from the question that raised them
        raised: dict[str, list] = {}
        for part in parts.values():
            for f in part.get("findings", []):
                raised.setdefault(f["kind"], []).append(f)
        merged["findings"] = [raised[k].pop(0) for k in merged["findings"]]
    return {k: merged[k] for k in json_key_order() if k in merged}


def recorded_text(stem: str) -> str:
    """The sample's whole terminal report, put together from the parts in reading order."""
    from nvtx_trace.analyzer.questions import text_sections

    parts = recorded(stem)
    return (parts[FRAME]["text_head"] + "".join(parts.get(q.name, {}).get("text", "") for q in text_sections())
            + parts[FRAME]["text_tail"])


def write_all() -> None:
    from nvtx_trace.analyzer import analyze

    by_question: dict[str, dict] = {}
    for report in SAMPLES:
        for name, part in parts_of(report, analyze(report)).items():
            by_question.setdefault(name, {})[report.stem] = part
    SNAPSHOTS.mkdir(exist_ok=True)
    for old in SNAPSHOTS.glob("*.json"):
        if old.stem not in by_question:
            old.unlink()
    for name, samples in by_question.items():
        (SNAPSHOTS / f"{name}.json").write_text(json.dumps(samples, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(by_question)} snapshots of {len(SAMPLES)} samples into {SNAPSHOTS.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/question_snapshots.py --update")
    sys.path.insert(0, str(ROOT))
    write_all()
