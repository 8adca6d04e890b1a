"""``nvtx-trace tune`` as terminal text and as one self-contained HTML page (nothing computed here)."""

from __future__ import annotations

import shlex
from html import escape as esc
from pathlib import Path

from nvtx_trace.report.console import table_or_blocks
from nvtx_trace.report.try_render import _ms, predicted_cell

COLUMNS = ("stage", "configuration", "top findings", "tried", "predicted", "measured", "kept", "why")


def _knobs(k: dict | None) -> str:
    from nvtx_trace import knobs as declared

    return declared.text(k) if k else ""


def cells(s: dict) -> list[str]:
    top = ", ".join(f["kind"] for f in s["top_findings"][:3])
    before = f"{_ms(s['baseline_step_ms'])} -> " if s.get("baseline_step_ms") else ""
    tried = _knobs(s["knobs"]) + (f" ({' '.join(s['options'])})" if s.get("options") else "")
    return [str(s["stage"]), _knobs(s["configuration"]) or "as it is", top, tried or "-",
            predicted_cell(s) if s["knobs"] else "", (before + _ms(s["measured_step_ms"]))
            if s["knobs"] else "", ("yes" if s["kept"] else "no") if s["knobs"] else "", s["why"]]


def mmss(seconds: float) -> str:
    seconds = max(0, int(round(seconds or 0)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def headline(d: dict) -> str:
    if d["speedup"] is None or not d["baseline_step_ms"]:
        return f"Tuning stopped ({d['stopped']}): nothing was measured"
    kept = _knobs(d["kept_knobs"]) or "nothing"
    how = {"final check": "measured against each other, alternating",
           "stages": "chained over the stages' trials",
           "profile": "from the profile (no trial ran)"}[d["step_source"]]
    return (f"Step {d['baseline_step_ms']:.2f} ms -> {d['final_step_ms']:.2f} ms ({d['speedup']:.2f}x; {how}); "
            f"kept: {kept}; stopped: {d['stopped']}")


def notes(d: dict) -> list[str]:
    out = []
    for s in d["stages"]:
        out += [f"  stage {s['stage']}: {line}" for line in s.get("changed") or []]
        for log in (s.get("logs") or [])[:1] if not s["kept"] and "failed" in s["why"] else []:
            out.append(f"  stage {s['stage']}: its output: {log}")
    if d["permanent"]:
        out.append("To keep them (nvtx-trace never edits your files):")
        if any(p.get("through_option") for p in d["permanent"]):
            python = ["python"] if d["command"][:1] == ["-m"] or d["command"][0].endswith(".py") else []
            out.append(f"  run it as: {shlex.join(python + list(d['command']))}")
        for p in d["permanent"]:
            if p.get("through_option"):
                out.append(f"  {_knobs({p['knob']: p['value']})}: this script's own option {p['script_flag']} (in the "
                           "command above); in code:")
            else:
                flag = f" (or this script's own option {p['script_flag']})" if p.get("script_flag") else ""
                out.append(f"  {_knobs({p['knob']: p['value']})}{flag}:")
            out += [f"      {line}" for line in p["lines"]]
    if d["remaining"]:
        src = (d.get("remaining_from") or {}).get("configuration") or {}
        later = {k: v for k, v in d["kept_knobs"].items() if src.get(k) != v}
        since = (f"; from the profile of {_knobs(src) or 'the program as it is'}, before {_knobs(later)} was kept"
                 if later else "")
        out.append(f"Left for you (neither a knob nor this program's options apply{since}):")
        for r in d["remaining"][:5]:
            gain = (f": predicted {r['predicted_step_ms']:.2f} ms a step ({r['saving_fraction']:.0%} less)"
                    if r.get("predicted_step_ms") is not None and (r.get("saving_fraction") or 0) > 0 else "")
            out.append(f"  {r['kind']}{gain}. {r['fix'] or r['title'] or ''}")
    t = d.get("time")
    if t and (t["trials"] or t["profiles_s"]):
        early = f", {t['stopped_early']} stopped early" if t["stopped_early"] else ""
        final = f", final check {mmss(t['final_check_s'])}" if t["final_check_s"] else ""
        out.append(f"Time: profiles {mmss(t['profiles_s'])}, trials {mmss(t['trials_s'])} ({t['trials']} trial(s), "
                   f"{t['runs']} plain run(s){early}){final}, of {mmss(d['elapsed_s'])} in all")
        if t.get("per_run"):
            out.append(f"  a plain run (median): {per_run_text(t['per_run'])}")
    fl = d.get("flops")
    if fl and fl.get("per_step"):
        out.append(f"Model FLOPs per step: {fl['per_step'] / 1e12:.3g} TFLOP ({fl['method']})")
        for s in fl.get("stages") or []:
            peak = f", {s['peak_fraction']:.0%} of the {fl['device']}'s dense {s['precision']} peak" \
                if s.get("peak_fraction") is not None else ""
            out.append(f"  {s['label']}: {s['tflops']:.1f} TFLOP/s{peak}")
    return out


def text(d: dict, console) -> None:
    from rich.table import Table

    table = Table(title="nvtx-trace tune: one row per stage (a profile, then one knob timed plain)",
                  title_justify="left")
    shown = COLUMNS[:-1]  # the why goes under the table, a line each: it is a sentence
    for col in shown:
        table.add_column(col, justify="right" if col in ("stage", "predicted", "measured") else "left",
                         overflow="fold")
    for s in d["stages"]:
        table.add_row(*cells(s)[:len(shown)])
    table_or_blocks(console, table, table.title, list(shown), [list(cells(s)[:len(shown)]) for s in d["stages"]])
    for s in d["stages"]:
        console.print(f"  stage {s['stage']}: {s['why']}", soft_wrap=True, markup=False, highlight=False)
    console.print(headline(d), soft_wrap=True, markup=False, highlight=False)
    for line in notes(d):
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def _bars(d: dict) -> str:
    """The program as it is and each kept configuration: its plain step as a bar, labelled with the share of the GPU's
    dense peak it reaches where the FLOPs were counted (inline SVG: no script needed)."""
    fl = d.get("flops") or {}
    if fl.get("stages"):
        points = [(r["label"], r["step_ms"], r.get("peak_fraction"), r.get("precision")) for r in fl["stages"]]
    else:
        points = [("as it is", d["baseline_step_ms"], None, None)] if d.get("baseline_step_ms") else []
        points += [(_knobs({**s["configuration"], **s["knobs"]}), s["measured_step_ms"], None, None)
                   for s in d["stages"] if s["kept"] and s["measured_step_ms"]]
    if not points:
        return ""
    top = max(v for _, v, _, _ in points) or 1.0
    bar, gap, width, left = 26, 10, 460, 330
    rows = []
    for i, (label, v, peak, precision) in enumerate(points):
        y = i * (bar + gap)
        w = max(1.0, width * v / top)
        share = f", {peak:.0%} of the {precision} peak" if peak is not None else ""
        rows.append(f"<g class='bar'><text x='0' y='{y + 17}'>{esc(label)}</text><rect x='{left}' y='{y}' "
                    f"width='{w:.1f}' height='{bar}' fill='#4a7fb5'/><text x='{left + 6 + w:.1f}' y='{y + 17}'>"
                    f"{v:.2f} ms{esc(share)}</text></g>")
    return (f"<svg width='{left + width + 260}' height='{len(points) * (bar + gap)}' role='img' "
            f"aria-label='step per configuration' style='font:12px system-ui'>{''.join(rows)}</svg>")


def _keep(d: dict) -> str:
    """What to change, as code: the tuned command line where the program's own options were kept, then each kept
    setting's lines in the program's own form."""
    if not d["permanent"]:
        return "<p>Nothing was kept: the program stays as it is.</p>"
    out = []
    if any(p.get("through_option") for p in d["permanent"]):
        python = ["python"] if d["command"][:1] == ["-m"] or d["command"][0].endswith(".py") else []
        out.append(f"<h3>Run it as</h3><pre class='keep'><code>{esc(shlex.join(python + list(d['command'])))}"
                   "</code></pre>")
    for p in d["permanent"]:
        where = ("this script's own option, in the command above" if p.get("through_option") else
                 f"or this script's own option {p['script_flag']}" if p.get("script_flag") else p["framework"])
        out.append(f"<h3><code>{esc(_knobs({p['knob']: p['value']}))}</code> <small>({esc(where)})</small></h3>"
                   f"<pre class='keep'><code>{esc(chr(10).join(p['lines']))}</code></pre>")
    return "".join(out)


def _stage_link(s: dict) -> str:
    """The stage's profile report, relative to tune.html (stage-N/profile/summary.html)."""
    if not s.get("profile"):
        return ""
    profile = Path(s["profile"])
    rel = profile.relative_to(profile.parents[1]).as_posix()
    return f"<a href='{esc(rel)}/summary.html'>stage {s['stage']} profile</a>"


def _stage_rows(d: dict) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in ("stage", "tried", "predicted", "measured", "kept", "why",
                                                  "profile", "time"))
    rows = []
    for s in d["stages"]:
        c = cells(s)
        spent = " + ".join(f"{mmss(s[k])} {w}" for k, w in (("profile_s", "profile"), ("trial_s", "trial"))
                           if s.get(k) is not None)
        rows.append("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in (c[0], c[3], c[4], c[5], c[6], s["why"]))
                    + f"<td>{_stage_link(s)}</td><td>{esc(spent)}</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _left(d: dict) -> str:
    if not d["remaining"]:
        return ""
    items = []
    for r in d["remaining"][:8]:
        gain = (f" (predicted {r['predicted_step_ms']:.2f} ms a step, {r['saving_fraction']:.0%} less)"
                if r.get("predicted_step_ms") is not None and (r.get("saving_fraction") or 0) > 0 else "")
        items.append(f"<li><b>{esc(r['kind'])}</b>{esc(gain)}: {esc(r['fix'] or r['title'] or '')}</li>")
    return ("<h2>Left for you</h2><p>Neither a knob nor this program's options apply these; each comes from the last "
            f"profile.</p><ul>{''.join(items)}</ul>")


def per_run_text(p: dict) -> str:
    return (f"{p['wall_s']:.1f} s: start-up and first step {p['start_s']:.1f} s, warm-up {p['warmup_s']:.1f} s, timed "
            f"{p['window_s']:.1f} s, exit {p['end_s']:.1f} s")


def html(d: dict) -> str:
    """tune.html: the headline, what to keep as code, the step (and share of peak) per configuration, the stages with
    a link to each profile's report, what is left, where the time went."""
    program = " ".join(d["program"])
    t = d.get("time") or {}
    spent = (f"<p class='time'>Time: profiles {mmss(t['profiles_s'])}, trials {mmss(t['trials_s'])}, final check "
             f"{mmss(t['final_check_s'])}, of {mmss(d['elapsed_s'])} (budget {mmss(d['budget_s'])})"
             + (f"; a plain run (median): {esc(per_run_text(t['per_run']))}" if t.get("per_run") else "") + ".</p>"
             if t else "")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>nvtx-trace tune: {esc(program)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1200px}}td,th{{padding:4px 8px;
border-bottom:1px solid #ddd;text-align:left;vertical-align:top}}pre.keep{{background:#f4f6f8;padding:8px 12px;
border-left:3px solid #4a7fb5;overflow-x:auto}}h3 small{{font-weight:normal;color:#555}}</style></head>
<body><h1>nvtx-trace tune</h1><p><code>{esc(program)}</code>: {d['rounds']} round(s) a side per trial, alternating,
plain (no profiler)</p><p class='headline'><b>{esc(headline(d))}</b></p>
<h2>What to change (nvtx-trace never edits your files)</h2>{_keep(d)}
<h2>Step per configuration</h2>{_bars(d)}
<h2>Stages</h2>{_stage_rows(d)}{_left(d)}{spent}</body></html>
"""
