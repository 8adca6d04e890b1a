"""Analyses as units: each says what it needs and what it produces; the pipeline orders them.

A unit reads the trace (and the results of the units it names in ``needs``), stores its
typed result on the ``Analysis`` under its own ``name``, and may own a section of
summary.json (``to_json``) and named DataFrames (``tables``). Adding an analysis is one
unit in its own module plus one line in ``units.UNITS``; docs/architecture.md walks
through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Context:
    """What every unit may read: the trace, the report's reader, the options, and results so far."""

    trace: Any  # analyzer.model.Trace
    reader: Any  # analyzer.reader.Reader
    result: Any  # analyzer.Analysis, filled unit by unit
    min_gap_ns: int
    loader_pattern: str
    warmup_steps: int | None
    step_range: str | None = None  # --step-range: the user's own ranges that are the steps


@dataclass(frozen=True)
class Unit:
    name: str  # what it produces: the Analysis attribute it sets
    run: Callable[[Context], None]
    needs: tuple[str, ...] = ()  # units whose results it reads
    to_json: Callable[[Any], dict] | None = None  # Analysis -> {summary.json key: value}
    tables: Callable[[Any], dict] | None = None  # Analysis -> {name: DataFrame} for notebooks
    launches: Callable[[Any], tuple | None] | None = None  # Trace -> the GPU ops whose launching calls it reads


def announce(units: list[Unit], trace) -> None:
    """Every unit's launch request, declared before any table is read: one runtime pass serves them all."""
    for unit in units:
        request = unit.launches(trace) if unit.launches is not None else None
        if request is not None:
            trace.want_launches(*request)


def ordered(units: list[Unit]) -> list[Unit]:
    """Units in an order where each runs after what it needs (stable: listed order otherwise)."""
    by_name = {u.name: u for u in units}
    for u in units:
        missing = [n for n in u.needs if n not in by_name]
        if missing:
            raise ValueError(f"analysis unit {u.name!r} needs {missing}, which no unit produces")
    done: list[Unit] = []
    seen: set[str] = set()
    visiting: set[str] = set()

    def visit(u: Unit) -> None:
        if u.name in seen:
            return
        if u.name in visiting:
            raise ValueError(f"analysis units depend on each other in a cycle through {u.name!r}")
        visiting.add(u.name)
        for n in u.needs:
            visit(by_name[n])
        visiting.discard(u.name)
        seen.add(u.name)
        done.append(u)

    for u in units:
        visit(u)
    return done


def run(units: list[Unit], ctx: Context) -> None:
    for unit in ordered(units):
        unit.run(ctx)
