"""What should the user change first? Every question's findings, with predictions, biggest cost first."""

from __future__ import annotations

from nvtx_trace.analyzer import basis as basis_
from nvtx_trace.analyzer import predict
from nvtx_trace.analyzer.collectives import ALONE_PREFIX
from nvtx_trace.analyzer.findings import Finding, ms
from nvtx_trace.analyzer.question import Context, Question


def build_findings(a) -> list[Finding]:
    """Each question's findings in registry order (a later question sees the earlier ones in ``basis.found``)."""
    from nvtx_trace.analyzer.questions import REGISTRY, idle_kinds

    basis = basis_.measure(a)
    for q in REGISTRY:
        if q.findings is not None:
            basis.found += q.findings(a, basis)
    out = basis.found
    predict.add_predictions(a, out, idle_kinds())
    # biggest cost first, but a fix the loader's pace leaves without gain after the ones that gain
    return sorted(out, key=lambda f: (bool(f.predicted and f.predicted.get("bound_by") == "loader"
                                           and f.predicted["saving_ns"] <= 0), -f.impact_ns))


def _run(ctx: Context) -> None:
    ctx.result.findings = build_findings(ctx.result)


def no_findings_line(warnings: list[str]) -> str:
    """"Nothing to fix", unless the report is one rank's whose busy time may be waiting for the others."""
    if any(w.startswith(ALONE_PREFIX) for w in warnings):
        return ("No findings above the thresholds in this one rank's report, but its time in collectives may be "
                f"waiting for other ranks (see the warning \"{ALONE_PREFIX} ...\").")
    return "No findings above the thresholds: nothing obvious to fix."


def _text(a, view) -> None:
    if not a.findings:
        view.print(f"[green]{no_findings_line(a.warnings)}[/green]")
        return
    view.print("[bold]Findings[/bold] (biggest measured cost first)")
    for i, f in enumerate(a.findings, 1):
        view.print(f"{i}. [bold]{f.kind}[/bold] [red]{ms(f.impact_ns)}[/red]  {view.escape(f.title)}", highlight=False)
        view.print(f"   [green]fix:[/green] {view.escape(f.fix)}", highlight=False)


QUESTION = Question(
    name="findings", order=140, run=_run, after_findings=True,
    json_keys=("findings",), json_at=130, to_json=lambda a: {"findings": [f.to_dict() for f in a.findings]},
    text=_text, text_at=90,
)
