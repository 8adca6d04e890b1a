"""The HTML report: one self-contained file a PyTorch user can open from file:// with no network.

Why it is built this way:

* Headline numbers come from ``summary.to_dict(analysis)``, the same dict the JSON
  output writes, so the page and ``--json`` can never disagree; each number
  carries its raw JSON value in ``data-key``/``data-value`` for tests.
* plotly.js is inlined once from the installed plotly package; figures are
  plain dicts embedded as one JSON document, escaped so that a kernel or NVTX
  name containing ``</script>`` or ``<!--`` cannot end the script element.
* Every piece of text is HTML-escaped; only the report's file name (not its
  path) and nsys/schema versions are written: no environment, no host names.
* Large reports are downsampled (see ``timeline.py``) and the page says so,
  naming ``--html-max-points``.
"""

from __future__ import annotations

import json as _json
from pathlib import Path
from string import Template

import pandas as pd

from nvtx_trace import __version__
from nvtx_trace.analyzer.findings import no_findings_line
from nvtx_trace.analyzer.summary import to_dict
from nvtx_trace.errors import MissingDependencyError
from nvtx_trace.files import write_atomically
from nvtx_trace.labels import depth_text
from nvtx_trace.report import memorychart, stepchart, timeline
from nvtx_trace.report.html_table import esc, fmt
from nvtx_trace.report.sections import html_tables
from nvtx_trace.units import ms, pct

TEMPLATE = Path(__file__).parent / "templates" / "report.html"
MAX_POINTS_OPTION = "--html-max-points"


def script_json(obj) -> str:
    """JSON safe inside <script type="application/json">: no '<', '>', '&' or line separators survive raw."""
    text = _json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def load_lanes(analysis) -> tuple[pd.DataFrame | None, dict[int, str]]:
    """NVTX ranges and thread labels for the timeline, as the analysis kept them (the ``lanes`` unit)."""
    return getattr(analysis, "nvtx_ranges", None), dict(getattr(analysis, "nvtx_threads", None) or {})


def render(analysis, max_points: int = timeline.DEFAULT_MAX_POINTS, ranges=None, thread_labels=None) -> str:
    """The whole page as a string."""
    if ranges is None:
        ranges, thread_labels = load_lanes(analysis)
    d = to_dict(analysis)
    figures, notes = [], []
    if ranges is None and thread_labels and "error" in thread_labels:
        notes.append(thread_labels.pop("error"))
    tl = timeline.build(analysis, ranges, thread_labels or {}, max_points=max_points)
    if tl.figure["data"]:
        figures.append({"div": "timeline", "figure": tl.figure, "step_labels": tl.step_labels})
    notes += tl.notes
    bd = analysis.step_breakdown
    step_note = None
    if bd is not None:
        fig, step_note = stepchart.figure(bd)
        figures.append({"div": "steps-chart", "figure": fig})
    if memorychart.drawn(analysis.memory):
        figures.append({"div": "memory-chart", "figure": memorychart.figure(analysis.memory)})
    js = _plotly_js()
    report = Path(str(analysis.path)).name
    named = f"{program} ({report})" if (program := (analysis.window or {}).get("program")) else report
    fields = {
        "title": esc(f"nvtx-trace: {named}"),
        # A run without GPU activity has no idle GPU to explain: its page is about where the steps' time goes.
        "heading": esc(f"{'Why the GPU idles' if d['devices'] else 'Where the time goes'}: {named}"),
        "meta": esc(f"nsys {analysis.nsys_version or '?'}, export schema {analysis.schema_version or '?'}, "
                    f"nvtx-trace {__version__}; gaps counted from {ms(analysis.min_gap_ns)}"),
        "headline": _headline(d),
        "findings": _findings(d),
        "timeline_section": _timeline_section(tl, notes, max_points, gpu=bool(d["devices"])) if tl.figure["data"] else
        "<p class='muted'>No GPU activity or NVTX ranges to draw.</p>",
        "steps_section": _steps_section(bd, step_note) if bd is not None else _no_step_chart(),
        "memory_section": memorychart.section(analysis.memory),
        "tables": html_tables(analysis, d),
        "plotly_js": js,
        "data_json": script_json({"figures": figures}),
    }
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(fields)


def write(analysis, path, max_points: int = timeline.DEFAULT_MAX_POINTS) -> Path:
    path = Path(path)
    write_atomically(path, render(analysis, max_points=max_points))
    return path


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise MissingDependencyError("the HTML summary needs plotly, which is not installed here: "
                                     "pip install plotly") from None

    return get_plotlyjs().replace("</script", "<\\/script")  # inert today; a future bundle must not end the tag


def _pct(x: float | None) -> str:
    return "n/a" if x is None else pct(x)


def num(value, text: str, key: str) -> str:
    """A headline number: shown formatted, with the JSON value it came from alongside for checking."""
    raw = "" if value is None else _json.dumps(value)
    return f'<span class="num" data-key="{esc(key)}" data-value="{esc(raw)}">{esc(text)}</span>'


def _two_kinds(s: dict) -> str:
    """Steps of two kinds: the mean (throughput) leads, both kinds follow; a median would describe neither."""
    m = s["modes"]
    return (f"<div class='big'>{num(s['step_ns_mean'], ms(s['step_ns_mean']), 'steps.summary.step_ns_mean')}"
            f"<small> mean</small></div><div>two kinds of step: "
            f"{num(m['low_steps'], str(m['low_steps']), 'steps.summary.modes.low_steps')} of about "
            f"{num(m['low_ns'], ms(m['low_ns']), 'steps.summary.modes.low_ns')} and "
            f"{num(m['high_steps'], str(m['high_steps']), 'steps.summary.modes.high_steps')} of about "
            f"{num(m['high_ns'], ms(m['high_ns']), 'steps.summary.modes.high_ns')}; the median, "
            f"{num(s['step_ns_median'], ms(s['step_ns_median']), 'steps.summary.step_ns_median')}, "
            "describes neither</div>")


def _uneven(s: dict) -> str:
    """Uneven steps (a few long ones): the mean sets throughput and leads; the median follows."""
    return (f"<div class='big'>{num(s['step_ns_mean'], ms(s['step_ns_mean']), 'steps.summary.step_ns_mean')}"
            f"<small> mean</small></div><div>uneven steps: the median, "
            f"{num(s['step_ns_median'], ms(s['step_ns_median']), 'steps.summary.step_ns_median')}, hides the long "
            "ones</div>")


def _headline(d: dict) -> str:
    cards = []
    for i, dev in enumerate(d["devices"]):
        wu = dev.get("window_utilization")
        cards.append(
            f"<div class='card'><div class='label'>GPU {esc(dev['device_id'])} · {esc(dev['name'])}</div>"
            f"<div class='big'>{num(wu, pct(wu) if wu is not None else '-', f'devices.{i}.window_utilization')}"
            f"<small> busy in the steady state</small></div>"
            f"<div>{num(dev['utilization'], pct(dev['utilization']), f'devices.{i}.utilization')} over the whole "
            f"trace ({num(dev['busy_ns'], ms(dev['busy_ns']), f'devices.{i}.busy_ns')} busy of "
            f"{num(dev['span_ns'], ms(dev['span_ns']), f'devices.{i}.span_ns')})</div>"
            f"<div>whole trace: idle {num(dev['gap_idle_ns'], ms(dev['gap_idle_ns']), f'devices.{i}.gap_idle_ns')} in "
            f"{num(dev['gap_count'], format(dev['gap_count'], ','), f'devices.{i}.gap_count')} gaps &ge; "
            f"{esc(ms(d['min_gap_ns']))}</div></div>")
    steps = d.get("steps") or {}
    s = steps.get("summary") or {}
    if s:
        cards.append(
            "<div class='card'><div class='label'>Steady-state step time</div>"
            + (_two_kinds(s) if s.get("modes") else _uneven(s) if s.get("statistic") == "mean" else
               f"<div class='big'>{num(s['step_ns_median'], ms(s['step_ns_median']), 'steps.summary.step_ns_median')}"
               f"<small> median</small></div>") +
            f"<div>p90 {num(s['step_ns_p90'], ms(s['step_ns_p90']), 'steps.summary.step_ns_p90')} over "
            f"{num(s['steady_steps'], str(s['steady_steps']), 'steps.summary.steady_steps')} steps "
            + (f"(the capture opened at step {esc(str(s['capture_first_step']))}, after warm-up"
               + (f"; {num(s['warmup_steps'], str(s['warmup_steps']), 'steps.summary.warmup_steps')} more left out"
                  if s["warmup_steps"] else "") + ")</div>"
               if s.get("capture_first_step") is not None else
               f"({num(s['warmup_steps'], str(s['warmup_steps']), 'steps.summary.warmup_steps')} warm-up left out)"
               "</div>")
            + (f"<div>GPU busy {num(s['gpu_busy_fraction'], _pct(s['gpu_busy_fraction']), 'steps.summary.gpu_busy_fraction')}"
               + (f" ({num(spin, _pct(spin), 'steps.summary.collective_wait_fraction')} spinning in collectives for a "
                  "peer)" if (spin := s.get("collective_wait_fraction")) is not None and spin >= 0.01 else "") + ", "
               if s["gpu_busy_fraction"] is not None else "<div>No GPU activity traced; ") +
            ("waiting for data "
             f"{num(s['loader_wait_fraction'], _pct(s['loader_wait_fraction']), 'steps.summary.loader_wait_fraction')}"
             " of step time" if s["loader_wait_fraction"] is not None else "no waits for data recorded")
            + "</div></div>")
    inst, prof = d.get("instrumentation"), d.get("profiler")
    if inst:
        depth = depth_text(inst.get("settings") or {})
        cost = inst["cost_ns_per_step"]
        median = s.get("step_ns_median")
        cards.append(
            f"<div class='card'><div class='label'>nvtx_autotrace's own cost</div>"
            f"<div class='big'>"
            f"{num(cost, ms(cost) if cost is not None else 'not measured', 'instrumentation.cost_ns_per_step')}"
            f"<small> CPU per step{' (' + esc(pct(cost / median)) + ' of the median step)' if cost and median else ''}"
            f"</small></div>"
            f"<div>{num(inst['ranges_per_step'], format(inst['ranges_per_step'], '.0f'), 'instrumentation.ranges_per_step')}"
            f" ranges per step; {esc(inst['method'])}"
            + (f"; {esc(depth)}" if depth else "")
            + "</div>"
            + (_profiler_line(prof) if prof and prof.get("cost_ns_per_step") is not None else "")
            + "</div>")
    causes = (d.get("idle_causes") or {}).get("window") or []
    if causes:
        total = {}
        for c in causes:
            total[c["device_id"]] = total.get(c["device_id"], 0) + c["idle_ns"]
        rows = "".join(
            f"<tr><td><span class='swatch' style='background:{timeline.CAUSE_COLORS.get(c['cause'], '#999')}'>"
            f"</span>{esc(c['label'])}{' (GPU ' + esc(c['device_id']) + ')' if len(total) > 1 else ''}</td>"
            f"<td class='r'>{num(c['idle_ns'], ms(c['idle_ns']), f'idle_causes.window.{j}.idle_ns')}</td>"
            f"<td class='r'>{num(c['share'], pct(c['share']), f'idle_causes.window.{j}.share')}</td>"
            f"<td><div class='bar' style='width:{max(1, round(100 * c['share']))}%;"
            f"background:{timeline.CAUSE_COLORS.get(c['cause'], '#999')}'></div></td></tr>"
            for j, c in enumerate(causes))
        window = d.get("window") or {}
        idle_total = " + ".join(ms(v) for v in total.values())
        cards.append(
            f"<div class='card wide'><div class='label'>Why the GPU idles: {esc(idle_total)} idle in gaps &ge; "
            f"{esc(ms(d['min_gap_ns']))}, {esc(window.get('source', ''))}</div>"
            f"<table class='causes'>{rows}</table></div>")
    elif d["devices"]:
        window = d.get("window") or {}
        idle = [1 - dev["window_utilization"] for dev in d["devices"] if dev.get("window_utilization") is not None]
        share = f" (the GPU is idle {pct(max(idle))} of the time)" if idle else ""
        cards.append(
            f"<div class='card wide'><div class='label'>Why the GPU idles</div>"
            f"<div>No idle gap &ge; {esc(ms(d['min_gap_ns']))} in the {esc(window.get('source', 'trace'))}"
            f"{esc(share)}: the idle time is spread over many shorter gaps, typically kernel launch overhead "
            f"(fewer, larger kernels help: torch.compile, CUDA graphs, a larger batch).</div></div>")
    if not cards:
        return "<p class='muted'>This report holds no GPU activity.</p>"
    return "<div class='cards'>" + "".join(cards) + "</div>"


def _no_step_chart() -> str:
    """Why there is no per-step chart: the breakdown exists whenever there are steps."""
    return ("<p class='muted'>No per-step breakdown: no step ranges (<code>step N</code>) and no repeating kernel "
            "sequence to infer steps from.</p>")


def _profiler_line(prof: dict) -> str:
    cost, ref = prof["cost_ns_per_step"], prof["outside_capture_step_ns"]
    return (f"<div>profiler's own tracing {num(cost, ms(cost), 'profiler.cost_ns_per_step')} a step (steps took "
            f"{num(ref, ms(ref), 'profiler.outside_capture_step_ns')} just before the capture)</div>")


def _findings(d: dict) -> str:
    if not d["findings"]:
        return f"<p class='ok'>{esc(no_findings_line(d['warnings']))}</p>"
    items = []
    first = d.get("first_change")
    mean = "mean " if first and first["statistic"] == "mean" else ""
    lead = (f"<p class='first'><b>First change</b> ({esc(first['kind'])}, finding 1): {esc(first['fix'])} Expected: {mean}step "
            f"{num(first['step_ns'], ms(first['step_ns']), 'first_change.step_ns')} -> about "
            f"{num(first['predicted_step_ns'], ms(first['predicted_step_ns']), 'first_change.predicted_step_ns')}.</p>"
            if first else "")
    for i, f in enumerate(d["findings"]):
        items.append(
            f"<li class='finding'><div class='fhead'><span class='impact'>"
            f"{num(f['impact_ns'], ms(f['impact_ns']), f'findings.{i}.impact_ns')}</span>"
            f"<span class='kind'>{esc(f['kind'])}</span> {esc(f['title'])}</div>"
            f"<div class='fix'><b>Fix:</b> {esc(f['fix'])}</div>"
            + (f"<div class='threshold'>threshold: {esc(f['threshold'])}</div>" if f.get("threshold") else "")
            + f"<details><summary>evidence</summary>{_evidence(f['evidence'])}</details></li>")
    return lead + "<ol class='findings'>" + "".join(items) + "</ol>"


def _evidence(ev, depth: int = 0) -> str:
    """Evidence of a finding, generically: scalars as a list, records as a small table."""
    if isinstance(ev, dict):
        if not ev:
            return ""
        return "<dl>" + "".join(f"<dt>{esc(k)}</dt>"
                                f"<dd>{_evidence(v, depth + 1) if isinstance(v, (dict, list)) else fmt(k, v)}</dd>"
                                for k, v in ev.items()) + "</dl>"
    if isinstance(ev, list):
        if ev and all(isinstance(r, dict) for r in ev):
            return _records_table(ev[:10], more=len(ev) - 10)
        return esc(", ".join(str(x) for x in ev[:20]))
    return esc(ev)


def _records_table(records: list[dict], more: int = 0) -> str:
    cols = list(dict.fromkeys(k for r in records for k in r))
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(
        f"<td class='{'r' if isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) else ''}'>"
        f"{_evidence(r.get(c)) if isinstance(r.get(c), (dict, list)) else fmt(c, r.get(c))}</td>" for c in cols)
        + "</tr>" for r in records)
    extra = f"<p class='muted'>… and {more:,} more rows (all of them are in the JSON output).</p>" if more > 0 else ""
    return f"<table class='data'><tr>{head}</tr>{body}</table>{extra}"


def _timeline_section(tl, notes: list[str], max_points: int, gpu: bool) -> str:
    out = ("<p class='muted'>Drag to zoom into a time range, double-click to zoom out. The legend above the chart "
           "names every colour (click an entry to hide it). "
           + ("Hover a coloured gap to see why the GPU was idle, or an NVTX range to see its name; colours of gaps "
              "and NVTX ranges match: an orange gap lies under an orange data-loading range. " if gpu else
              "Hover an NVTX range to see its name and time. ")
           + "Each step is labelled with its number; where labels would overlap, every k-th is, and the steps "
           "lane says which. The view opens on the steady state (shaded) that the findings are measured over; "
           "double-click the chart to see the whole trace.</p>")
    if tl.notes:
        out += ("<div class='note'><b>Aggregated to keep this page small, fast and readable</b> "
                f"({tl.items:,} items drawn, budget {max_points:,}; raise it with "
                f"<code>{MAX_POINTS_OPTION} N</code>). Numbers above and in the tables are exact.<ul>"
                + "".join(f"<li>{esc(n)}</li>" for n in tl.notes) + "</ul></div>")
    out += "".join(f"<div class='note'>{esc(n)}</div>" for n in notes if n not in tl.notes)
    return out + "<div id='timeline' class='plot'></div>"


def _steps_section(bd, note: str | None) -> str:
    if stepchart.without_gpu(bd):
        measured = {col for col, _, _ in stepchart.parts(bd)}
        out = ("<p class='muted'>This report holds no GPU activity, so each bar is one step's wall time on the "
               "training thread: "
               + ("waiting for data (its loader wait ranges inside the step), " if "loader_ns" in measured else "")
               + ("host syncs, " if "sync_ns" in measured else "")
               + "and the rest, its own CPU work (forward, backward, optimizer, anything else)."
               + ("" if "loader_ns" in measured else " No loader wait ranges were captured.")
               + ("" if "sync_ns" in measured else " Host syncs are not measured without CUDA tracing.") + "</p>")
    else:
        out = ("<p class='muted'>Each bar is one step's wall time, split by what the GPU was doing. Idle time is "
               "split among causes as in the headline; “other” is idle time of other causes or in gaps shorter "
               "than the minimum gap.</p>")
    if note:
        out += f"<div class='note'>{esc(note)}.</div>"
    return out + "<div id='steps-chart' class='plot'></div>"
