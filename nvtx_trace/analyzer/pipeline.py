"""Running the registered questions: their launch requests first, then each after what it needs.

``questions.REGISTRY`` lists them in declared order; ``ordered`` keeps that order where needs allow (a
stable topological sort) and names a missing or circular need.
"""

from __future__ import annotations

from nvtx_trace.analyzer.question import Context, Question


def announce(questions: list[Question], trace) -> None:
    """Every question's requests, declared before any table is read: one pass per table serves them all."""
    for q in questions:
        request = q.launches(trace) if q.launches is not None else None
        if request is not None:
            trace.want_launches(*request)
        if q.announce is not None:
            q.announce(trace)


def needs_of(q: Question, questions: list[Question]) -> tuple[str, ...]:
    extra = tuple(o.name for o in questions if o.findings is not None) if q.after_findings else ()
    return q.needs + extra


def ordered(questions: list[Question]) -> list[Question]:
    """Questions in an order where each runs after what it needs (stable: declared order otherwise)."""
    by_name = {q.name: q for q in questions}
    needs = {q.name: needs_of(q, questions) for q in questions}
    for q in questions:
        missing = [n for n in needs[q.name] if n not in by_name]
        if missing:
            raise ValueError(f"question {q.name!r} needs {missing}, which no question produces")
    done: list[Question] = []
    seen: set[str] = set()
    visiting: set[str] = set()

    def visit(q: Question) -> None:
        if q.name in seen:
            return
        if q.name in visiting:
            raise ValueError(f"questions depend on each other in a cycle through {q.name!r}")
        visiting.add(q.name)
        for n in needs[q.name]:
            visit(by_name[n])
        visiting.discard(q.name)
        seen.add(q.name)
        done.append(q)

    for q in questions:
        visit(q)
    return done


def run(questions: list[Question], ctx: Context) -> None:
    """Each question in turn (the Analysis already holds every result's unset value); each may read which
    questions run with it (``ctx.questions``), never import them."""
    ctx.questions = tuple(questions)
    for q in ordered(questions):
        if q.run is not None:
            q.run(ctx)
