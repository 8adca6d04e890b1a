"""`nvtx-trace try` as terminal text and as one self-contained HTML page (nothing computed here)."""

from __future__ import annotations

from html import escape as esc

from nvtx_trace.report.console import table_or_blocks

TITLE = ("Measured without the profiler (step: each round's median of its steady steps, or mean if uneven; "
         "median of rounds)")
COLUMNS = ("variant", "rounds", "step", "speed-up", "finding", "predicted", "verdict")


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f} ms"


def cells(r: dict) -> list[str]:
    unapplied = r.get("unapplied") or []
    label = r["label"] + (" (not applied)" if unapplied and set(unapplied) == set(r["knobs"]) else
                          f" ({', '.join(unapplied)} not applied)" if unapplied else "")
    return [label, " / ".join("-" if x is None else f"{x:.2f}" for x in r["rounds_ms"]),
            _ms(r["measured_step_ms"]) + (" mean" if r.get("statistic") == "mean" else ""),
            "" if r["speedup"] is None else f"{r['speedup']:.2f}x", r["finding"] or "", predicted_cell(r),
            r["verdict"] or ""]


def predicted_cell(r: dict) -> str:
    """The predicted step and the finding's saving it came from (the number run and analyze print)."""
    if r.get("predicted_step_ms") is None:
        return ""
    saving = r.get("predicted_saving_ms")
    return _ms(r["predicted_step_ms"]) + (f" (-{saving:.2f})" if saving else "")


def notes(d: dict) -> list[str]:
    """The lines under the table: what each knob changed, the losses, failures, wrong findings."""
    rows = d["variants"]
    out = []
    for r in rows[1:]:
        out += [f"  {line}" for line in r["changed"]]
        if r.get("unapplied") and set(r["unapplied"]) == set(r["knobs"]):
            out.append(f"  {r['label']}: {', '.join(r['unapplied'])} changed nothing in this program (see the lines "
                       "above), so its timing is the baseline's program: run once, no verdict")
        elif r.get("unapplied"):
            out.append(f"  {r['label']}: {', '.join(r['unapplied'])} changed nothing in this program (see the lines "
                       "above); the timing is the other knobs'")
        if r["loss_max_rel_diff"] is not None:
            shown = ", ".join("-" if x is None else f"{x:.4g}" for x in r["losses"])
            base = ", ".join("-" if x is None else f"{x:.4g}" for x in rows[0]["losses"])
            noise = r.get("loss_noise_rel")
            floor = (f"; the baseline's own rounds differ by up to {noise * 100:.2g} %" if noise is not None
                     else "; one baseline round, so its own run-to-run difference is unknown")
            out.append(f"  {r['label']}: loss of steps 0-{len(r['losses']) - 1}: {shown} (baseline {base}); largest "
                       f"difference {r['loss_max_rel_diff'] * 100:.2g} %{floor}"
                       + (f" ({', '.join(r['numerics'])} change(s) the arithmetic)" if r["numerics"] else ""))
        elif r["numerics"]:
            out.append(f"  {r['label']}: {', '.join(r['numerics'])} change(s) the arithmetic, and no loss was "
                       "recorded to compare (Tensor.backward was not called on a one-element tensor)")
        if any(r.get("compiled_steps_left_out") or ()):
            left = ", ".join(f"{n} ({ms / 1000:.1f} s)" for n, ms in zip(r["compiled_steps_left_out"],
                                                                     r["compiled_ms_left_out"]))
            out.append(f"  {r['label']}: steps in which torch.compile made a new graph (a first call, a new shape, "
                       f"model.eval()) are left out of its timing, a cost paid once: per round {left}")
        for why in r["failures"]:
            out.append(f"  {r['label']}: a round gave no step time: {why}")
        if r["verdict"] == "not confirmed":
            out.append(f"  {r['label']}: the {r['finding']} finding was wrong here: its fix did not make the step "
                       "faster")
    for r in rows[1:]:
        if r.get("statistic") != rows[0].get("statistic") and r.get("baseline_step_ms"):
            out.append(f"  {r['label']}: compared with the baseline by the {r['statistic']} step, as one side's steps "
                       f"are uneven: baseline {r['baseline_step_ms']:.2f} ms against {r['measured_step_ms']:.2f} ms "
                       f"(medians {rows[0]['median_step_ms']:.2f} and {r['median_step_ms']:.2f} ms)")
    for why in rows[0]["failures"]:
        out.append(f"  baseline: a round gave no step time: {why}")
    for r in rows[1:]:
        if r.get("tool_cost_ms"):
            out.append(f"  {r['label']}: {r['tool_cost_ms']:.2f} ms of the {r['finding']} finding's saving "
                       f"({r['predicted_saving_ms']:.2f} ms a step) was the tool's own cost: the profile's step was "
                       f"longer than this plain baseline by that much more than the profile could take out itself; "
                       "the prediction is the rest off the baseline")
    return out


def text(d: dict, console) -> None:
    from rich.table import Table

    table = Table(title=TITLE, title_justify="left")
    widest = max(len(cells(r)[0]) for r in d["variants"])
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("variant", "finding", "verdict") else "right",
                         no_wrap=col != "rounds", min_width=min(widest, 40) if col == "variant" else None)
    for r in d["variants"]:
        table.add_row(*cells(r))
    table_or_blocks(console, table, TITLE, list(COLUMNS), [list(cells(r)) for r in d["variants"]])
    for line in notes(d):
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def html(d: dict) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td class='{esc(r['verdict'] or '').replace(' ', '-')}'>{esc(c)}</td>"
                                    if i == 6 else f"<td>{esc(c)}</td>" for i, c in enumerate(cells(r))) + "</tr>"
                   for r in d["variants"])
    lines = "".join(f"<li>{esc(line.strip())}</li>" for line in notes(d))
    program = " ".join(d["program"])
    judged = [f"{r['finding']} (for {r['label']}: {r['predicted_saving_ms']:.2f} ms a step saved, predicted)"
              for r in d["variants"] if r.get("finding") and r.get("predicted_saving_ms") is not None]
    profile = (f"<p>Findings and predictions from {esc(str(d['profile']))}: "
               f"{esc('; '.join(judged)) if judged else 'none of them is the fix of a variant here'}</p>"
               if d.get("profile") else "")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>nvtx-trace try: {esc(program)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}td,th{{padding:4px 8px;border-bottom:1px solid #ddd;
text-align:left}}.confirmed{{color:#127a12}}.not-confirmed{{color:#b00}}.partly{{color:#a60}}</style></head>
<body><h1>nvtx-trace try</h1><p><code>{esc(program)}</code>, {d['rounds']} round(s) each, alternating</p>{profile}
<p>{esc(TITLE)}</p><table><tr>{head}</tr>{rows}</table><ul>{lines}</ul></body></html>
"""
