"""`nvtx-trace diff` as terminal text and as one self-contained HTML page (nothing computed here)."""

from __future__ import annotations

from html import escape as esc

from nvtx_trace.units import ms, pct

STATUS_STYLE = {"resolved": "green", "improved": "green", "unchanged": "yellow", "worse": "red", "new": "red"}


def _step(side: dict, statistic: str) -> str:
    value = side.get(f"step_ns_{statistic}")
    return ms(value) if value else "-"


def _busy(side: dict) -> str:
    return pct(side["gpu_busy_fraction"]) if side.get("gpu_busy_fraction") is not None else "-"


def _headline(d: dict) -> str:
    b, a = d["before"], d["after"]
    stat = d.get("step_statistic", "median")
    line = f"Steady step ({stat}) {_step(b, stat)} -> {_step(a, stat)}"
    if d.get("speedup"):
        line += f" ({d['speedup']:.2f}x {'faster' if d['speedup'] >= 1 else 'slower'})"
    if b.get("gpu_busy_fraction") is None and a.get("gpu_busy_fraction") is None:
        return line  # neither side was profiled on a GPU (a try variant, a CPU run): nothing to show
    return line + f"; GPU busy {_busy(b)} -> {_busy(a)}"


def _prediction(row: dict) -> str:
    if "predicted_step_ns" not in row:
        return ""
    stat = row.get("prediction_statistic")
    return (f"predicted {ms(row['predicted_step_ns'])}, measured {ms(row['measured_step_ns'])} "
            f"({stat + ', ' if stat else ''}{row['prediction_error']:+.0%})")


def _tried(d: dict) -> str:
    """The line of a variant nvtx-trace try timed: no profile on that side, so no findings to compare."""
    t = d.get("try")
    if not t and d["after"].get("profiled", True) and d["before"].get("profiled", True):
        return ""
    line = "Timed by nvtx-trace try without a profiler: no findings on that side"
    if t:
        line += (f"; the {t['finding']} finding predicted {ms(t['predicted_step_ns'])}, measured "
                 f"{ms(t['measured_step_ns'])} ({t['prediction_error']:+.0%}): {t['verdict']}")
    return line


def text(d: dict, console) -> None:
    from rich.table import Table

    console.print(_headline(d), highlight=False)
    if _tried(d):
        console.print(_tried(d), highlight=False, soft_wrap=True)
    t = Table(show_edge=False, title="Findings, before -> after", title_justify="left")
    for col in ("finding", "status", "before", "after", "the first run's prediction"):
        t.add_column(col)
    for row in d["findings"]:
        name = row["kind"] + (f" ({row['cause']})" if row.get("cause") else "")
        style = STATUS_STYLE.get(row["status"], "")
        t.add_row(name, f"[{style}]{row['status']}[/{style}]" if style else row["status"],
                  ms(row["before_impact_ns"]) if row["before_impact_ns"] is not None else "-",
                  ms(row["after_impact_ns"]) if row["after_impact_ns"] is not None else "-", _prediction(row))
    if d["findings"]:
        console.print(t)
    else:
        console.print("No findings in either run.")


def html(d: dict) -> str:
    rows = "".join(
        f"<tr><td>{esc(r['kind'])}{esc(' (' + r['cause'] + ')') if r.get('cause') else ''}</td>"
        f"<td class='{esc(r['status'])}'>{esc(r['status'])}</td>"
        f"<td>{esc(ms(r['before_impact_ns'])) if r['before_impact_ns'] is not None else '-'}</td>"
        f"<td>{esc(ms(r['after_impact_ns'])) if r['after_impact_ns'] is not None else '-'}</td>"
        f"<td>{esc(_prediction(r))}</td><td>{esc(r['title'])}</td></tr>" for r in d["findings"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>nvtx-trace diff</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}td,th{{padding:4px 8px;border-bottom:1px solid #ddd;
text-align:left;vertical-align:top}}.resolved,.improved{{color:#127a12}}.worse,.new{{color:#b00}}</style></head>
<body><h1>nvtx-trace diff</h1><p>{esc(str(d['before'].get('report')))} &rarr; {esc(str(d['after'].get('report')))}</p>
<p><b>{esc(_headline(d))}</b></p><p>{esc(_tried(d))}</p>
<table><tr><th>finding</th><th>status</th><th>before</th><th>after</th><th>the first run's prediction</th>
<th>what it said</th></tr>{rows}</table></body></html>
"""
