"""`nvtx-trace try KNOB=VALUE... train.py args...`: apply a fix without editing the script, and measure it.

Thin on purpose: ``nvtx_trace.runner.whatif`` runs and times; this parses the knobs, shows progress on
stderr, prints the table (and the predictions of a run's findings beside it, ``--from``) and writes JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from nvtx_trace import names
from nvtx_trace.errors import UsageError

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}
# the knob that applies a finding's fix, for findings whose `recommend` does not name one
KIND_KNOBS = {"layout_transpose": {"channels_last": True}, "pageable_h2d": {"pin_memory": True}}
CONFIRMED_WITHIN = 0.25  # measured step within 25 % of the predicted one
HELPED = 0.03  # a variant at least 3 % faster than the baseline helped


def try_(
    target: List[str] = typer.Argument(
        None, metavar="KNOB=VALUE... SCRIPT.py [ARGS]...",
        help=f"Knobs, then the script and its arguments. Knobs: {', '.join(names.KNOBS)}."),
    rounds: int = typer.Option(2, "--rounds", help="Runs of the baseline and of each variant, alternating."),
    each: bool = typer.Option(False, "--each", help="Try each knob on its own (default: all of them together)."),
    from_run: Optional[Path] = typer.Option(
        None, "--from", help="A run folder or summary.json: its findings' predictions go beside the measurements."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the results as JSON to this path."),
    force: bool = typer.Option(False, "--force", "-f", help="Allow --json to overwrite an existing file."),
    python: Optional[str] = typer.Option(None, "--python", help="Python that runs the script (default: this one)."),
    advice: bool = typer.Option(
        False, "--advice", help="Profile first (nvtx-trace run), then try each top finding's own knobs, one at a time."),
) -> None:
    """Run the script as it is and with the knobs applied (no profiler attached), time the steady steps of
    each, alternating, and say what each knob saved; with --from, whether the prediction held.

    Example: nvtx-trace try --from nvtx-trace-out/train-1 amp=bf16 tf32=1 train.py --epochs 1
    """
    from nvtx_trace.runner import whatif

    knobs, program = _split(target or [], need_knobs=not advice)
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if json_out:
        from nvtx_trace.report.outputs import check_outputs

        check_outputs([json_out], [Path(program[0]), *([from_run] if from_run else [])], force)
    if advice and (knobs or from_run):
        raise UsageError("--advice takes its knobs from the profile it runs: give neither knobs nor --from with it")
    if advice:
        from_run = _profile(program, python)
    findings = _findings(from_run) if from_run else []
    if advice:
        sets = _advised(findings)
        if not sets:
            raise UsageError(f"{from_run}: no finding has a fix that a knob applies ({', '.join(names.KNOBS)}); "
                             "nothing to try")
    else:
        sets = [{k: v} for k, v in knobs.items()] if each else [knobs]
    print(f"nvtx-trace try: {program[0]}: the baseline and {len(sets)} variant(s), {rounds} round(s) each, "
          "alternating; no profiler attached, steps timed after warm-up", file=sys.stderr, flush=True)
    variants = whatif.compare(program, sets, rounds, python,
                              progress=lambda m: print(f"nvtx-trace try: {m}", file=sys.stderr, flush=True))
    rows = [_row(v, variants[0], findings) for v in variants]
    _print(rows, variants)
    if json_out:
        json_out.write_text(json.dumps({"program": program, "rounds": rounds, "variants": rows}, indent=2) + "\n")
        print(f"Wrote {json_out}")


def _profile(program: list[str], python: str | None) -> Path:
    """``nvtx-trace run`` of the program (default window, no history row): the folder it wrote."""
    import subprocess
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="nvtx-trace-advice-")) / "run"
    print(f"nvtx-trace try: --advice: profiling {program[0]} first (nvtx-trace run, outputs in {out})",
          file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "nvtx_trace.cli", "run", "--out", str(out), "--no-history",
           *(["--python", python] if python else []), *program]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if not (out / "summary.json").is_file():
        raise UsageError(f"--advice: the profile run wrote no summary.json (exit status {proc.returncode}); "
                         f"run nvtx-trace run {' '.join(program)} to see why")
    return out


def _advised(findings: list[dict], top: int = 3) -> list[dict]:
    """The knobs of the top findings (in their rank order) whose fix a knob applies, one set each."""
    sets: list[dict] = []
    for f in findings:
        knobs = {k: v for k, v in _knobs_of(f).items() if not (k == "amp" and v == "fp16")}
        if knobs and knobs not in sets:
            sets.append(knobs)
        if len(sets) == top:
            break
    return sets


def _split(target: list[str], need_knobs: bool = True) -> tuple[dict, list[str]]:
    """KNOB=VALUE words first, then the program."""
    knobs: dict = {}
    i = 0
    while i < len(target) and "=" in target[i] and target[i].split("=", 1)[0] in names.KNOBS:
        try:
            knobs.update(names.parse_knobs(target[i]))
        except ValueError as exc:
            raise UsageError(f"{exc}") from None
        i += 1
    program = target[i:]
    if not knobs and need_knobs:
        raise UsageError(f"no knob given: nvtx-trace try KNOB=VALUE... SCRIPT.py [ARGS] (knobs: "
                         f"{', '.join(names.KNOBS)})")
    if not program or not program[0].endswith(".py"):
        raise UsageError("no script after the knobs: nvtx-trace try KNOB=VALUE... SCRIPT.py [ARGS] "
                         "(or nvtx-trace try --advice SCRIPT.py [ARGS])")
    if not Path(program[0]).is_file():
        raise UsageError(f"{program[0]}: no such file")
    return knobs, program


def _findings(path: Path) -> list[dict]:
    from nvtx_trace.diff import load_summary

    return load_summary(path).get("findings") or []


def _knobs_of(finding: dict) -> dict:
    """The knobs that apply the fix the finding predicted (precision predicts its first step: TF32 from fp32)."""
    rec = finding.get("recommend") or {}
    out = {k: v for k, v in rec.items() if k in names.KNOBS}
    if finding.get("kind") == "precision" and out:
        out = dict([next(iter(out.items()))])
    return out or KIND_KNOBS.get(finding.get("kind"), {})


def _row(v, base, findings: list[dict]) -> dict:
    from nvtx_trace.runner import whatif

    measured, before = v.step_ms, base.step_ms
    row = {"knobs": v.knobs, "label": v.label, "rounds_ms": [r.value_ms for r in v.rounds],
           "statistic": v.rounds[0].statistic if v.rounds else None, "measured_step_ms": measured,
           "speedup": before / measured if measured and before and v.knobs else None,
           "changed": sorted({ln for r in v.rounds for ln in r.lines}),
           "numerics": sorted(k for k in v.knobs if k in names.NUMERICS_KNOBS),
           "failures": [r.why for r in v.rounds if r.value_ms is None],
           "losses": v.rounds[0].losses if v.rounds else [],
           "loss_max_rel_diff": (whatif.loss_difference(base.rounds[0].losses, v.rounds[0].losses)
                                 if v.knobs and v.rounds and base.rounds else None)}
    match = next((f for f in findings if v.knobs and _knobs_of(f) == v.knobs), None)  # its fix, no more, no less
    row["finding"] = match.get("kind") if match else None
    pred = (match or {}).get("predicted")
    if pred and before and measured:
        ratio = pred["step_ns"] / (pred["step_ns"] + pred["saving_ns"])
        row["predicted_step_ms"] = before * ratio
        helped = measured <= (1 - HELPED) * before
        close = abs(measured - row["predicted_step_ms"]) <= CONFIRMED_WITHIN * measured
        row["verdict"] = "confirmed" if close else "partly" if helped else "not confirmed"
    else:
        row["predicted_step_ms"], row["verdict"] = None, None
    return row


def _print(rows: list[dict], variants) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title="Measured without the profiler (step: median of a round's steady steps, or mean if uneven; "
                        "median of rounds)", title_justify="left")
    for col in ("variant", "rounds", "step", "speed-up", "finding", "predicted", "verdict"):
        table.add_column(col, justify="left" if col in ("variant", "finding", "verdict") else "right")
    for r in rows:
        table.add_row(r["label"], " / ".join("-" if x is None else f"{x:.2f}" for x in r["rounds_ms"]),
                      "-" if r["measured_step_ms"] is None else f"{r['measured_step_ms']:.2f} ms",
                      "" if r["speedup"] is None else f"{r['speedup']:.2f}x", r["finding"] or "",
                      "" if r["predicted_step_ms"] is None else f"{r['predicted_step_ms']:.2f} ms", r["verdict"] or "")
    console.print(table)
    for r in rows[1:]:
        for line in r["changed"]:
            console.print(f"  {line}")
        if r["loss_max_rel_diff"] is not None:
            shown = ", ".join("-" if x is None else f"{x:.4g}" for x in r["losses"])
            base = ", ".join("-" if x is None else f"{x:.4g}" for x in rows[0]["losses"])
            console.print(f"  {r['label']}: loss of steps 0-{len(r['losses']) - 1}: {shown} (baseline {base}); largest "
                          f"difference {r['loss_max_rel_diff'] * 100:.2g} %"
                          + (f" ({', '.join(r['numerics'])} change(s) the arithmetic)" if r["numerics"] else ""))
        elif r["numerics"]:
            console.print(f"  {r['label']}: {', '.join(r['numerics'])} change(s) the arithmetic, and no loss was "
                          "recorded to compare (Tensor.backward was not called on a one-element tensor)")
        for why in r["failures"]:
            console.print(f"  {r['label']}: a round gave no step time: {why}")
        if r["verdict"] == "not confirmed":
            console.print(f"  {r['label']}: the {r['finding']} finding was wrong here: its fix did not make the step "
                          "faster")
