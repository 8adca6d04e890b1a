"""What should the user change first? Every question's findings, with predictions, ranked by what their fix
is expected to save over the window: the predicted saving per step times the steady steps (and GPUs) where
there is a prediction, else the measured cost. Last come GPU-work findings with no prediction (the GPU is not
what sets the step's pace, so less GPU work would not shorten it yet), then fixes the loader's pace leaves
without gain."""

from __future__ import annotations

import re

from nvtx_trace.analyzer import basis as basis_
from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.findings import Finding, no_findings_line
from nvtx_trace.analyzer.question import Context, Question, kinds, prediction_rules
from nvtx_trace.units import ms


def build_findings(analysis, questions: tuple) -> list[Finding]:
    """Each question's findings in registry order (a later question sees the earlier ones in ``basis.found``)."""
    basis = basis_.measure(analysis)
    for q in questions:
        if q.findings is not None:
            raised = q.findings(analysis, basis)
            basis.found += raised
            analysis.raised_by.update((f.kind, q.name) for f in raised)
    out = basis.found
    predict.add_predictions(analysis, out, kinds(questions, "idle_kinds"), prediction_rules(questions))
    _in_the_framework_s_words(analysis, out)
    steps = len(analysis.steps.steady) if analysis.steps else 0
    gpus = max(1, len(analysis.idle.devices) if analysis.idle else 1)

    gpu_work = kinds(questions, "work_kinds")

    def rank(f: Finding) -> tuple:
        p = f.predicted
        if p is not None and p["saving_ns"] <= 0 and p.get("bound_by") == "loader":
            return 2, -f.impact_ns  # the loader's pace leaves this fix without gain
        if p is None or p["saving_ns"] <= 0 or not steps:  # the tool cannot say what it saves: its cost
            return (1 if steps and p is None and f.kind in gpu_work else 0), -f.impact_ns
        return 0, -p["saving_ns"] * steps * gpus

    return sorted(out, key=rank)


def _in_the_framework_s_words(analysis, findings: list[Finding]) -> None:
    """A loop a framework drives (the settings record says which) gets each fix's settings in its own options."""
    from nvtx_trace import knobs as declared

    for f in findings:
        f.fix += declared.sentence(analysis.settings, dict(f.recommend or {}))


def first_change(analysis) -> dict | None:
    """The one change to make first: the top finding, when its fix is predicted to shorten the step."""
    top = analysis.findings[0] if analysis.findings else None
    if top is None or not top.predicted or top.predicted["saving_ns"] <= 0:
        return None
    p = top.predicted
    first_sentence = re.split(r"\. (?=[A-Z])", top.fix, maxsplit=1)[0]
    return {"kind": top.kind, "fix": first_sentence.rstrip(".") + ".",
            "step_ns": int(p["step_ns"] + p["saving_ns"]), "predicted_step_ns": int(p["step_ns"]),
            "statistic": p.get("statistic", "median")}


def _run(ctx: Context) -> None:
    ctx.result.findings = build_findings(ctx.result, ctx.questions)


def _text(analysis, view) -> None:
    if not analysis.findings:
        view.print(f"[green]{no_findings_line(analysis.warnings)}[/green]")
        return
    first = first_change(analysis)
    if first:
        mean = "mean " if first["statistic"] == "mean" else ""
        view.print(f"[bold]First change[/bold] ({first['kind']}, finding 1): {view.escape(first['fix'])} Expected: "
                   f"{mean}step {ms(first['step_ns'])} -> about {ms(first['predicted_step_ns'])}.", highlight=False)
    view.print("[bold]Findings[/bold] (largest expected saving first; the figure is each one's measured cost)")
    width = len(f"{len(analysis.findings)}.")
    for i, f in enumerate(analysis.findings, 1):
        view.item(f"{i}.".ljust(width), f"[bold]{f.kind}[/bold] [red]{ms(f.impact_ns)}[/red]  {view.escape(f.title)}",
                  f"[green]fix:[/green] {view.escape(f.fix)}")


QUESTION = Question(
    name="findings", order=140, run=_run, after_findings=True,
    json_keys=("first_change", "findings"), json_at=130,
    to_json=lambda analysis: {"first_change": first_change(analysis), "findings": [f.to_dict() for f in analysis.findings]},
    text=_text, text_at=90,
)
