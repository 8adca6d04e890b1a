"""Two runs side by side: did the change do what the first run's findings promised?

Each side is a report (.sqlite, .nsys-rep), a summary.json, or a run folder (its summary.json,
else its report.sqlite). Compared: the steady step median and GPU busy share, each finding by
kind (and cause, for CPU-bound ones) as resolved / improved / unchanged / worse / new, and the
before-run's predicted step beside the step measured after.
"""

from __future__ import annotations

import json
from pathlib import Path

from nvtx_trace.analyzer.steps import typical_step_ns
from nvtx_trace.errors import BadReportError

IMPROVED = 0.8  # an impact below this x the earlier one is an improvement; above 1/IMPROVED, worse


def load_summary(path: Path) -> dict:
    """summary.json of a report, a summary file, or a run folder."""
    path = Path(path)
    if path.is_dir():
        if (path / "summary.json").is_file():
            path = path / "summary.json"
        elif (path / "report.sqlite").is_file():
            path = path / "report.sqlite"
        elif not any(p.suffix in (".sqlite", ".nsys-rep", ".qdrep") for p in path.iterdir()):
            raise BadReportError(f"{path}: a folder without summary.json, report.sqlite or rank reports; give a "
                                 "report, a summary.json or an nvtx-trace run folder")
        # else: a folder of per-rank reports (run --per-rank), analyzed together below
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BadReportError(f"{path}: not a readable summary.json ({exc})") from None
        if not isinstance(data, dict) or "findings" not in data:
            raise BadReportError(f"{path}: not an nvtx-trace summary.json (no findings)")
        return data
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.analyzer.inputs import expand
    from nvtx_trace.capture.export import as_sqlite
    from nvtx_trace.report.json import to_dict

    return json.loads(json.dumps(to_dict(analyze([as_sqlite(p) for p in expand(path)]))))


def _key(finding: dict) -> tuple[str, str]:
    return finding["kind"], str((finding.get("evidence") or {}).get("cause") or "")


def _summary(report: dict) -> dict:
    return (report.get("steps") or {}).get("summary") or {}


def _typical(report: dict) -> tuple[int | None, str]:
    return typical_step_ns(_summary(report))


def compare(before: dict, after: dict) -> dict:
    """The diff as the documented JSON (docs/json-schema.md, "diff")."""
    (_, b_stat), (_, a_stat) = _typical(before), _typical(after)
    b_find = {_key(f): f for f in before.get("findings") or []}
    a_find = {_key(f): f for f in after.get("findings") or []}
    findings = []
    for key in list(b_find) + [k for k in a_find if k not in b_find]:
        b, a = b_find.get(key), a_find.get(key)
        if a is None:
            status = "resolved"
        elif b is None:
            status = "new"
        elif a["impact_ns"] < IMPROVED * b["impact_ns"]:
            status = "improved"
        elif a["impact_ns"] > b["impact_ns"] / IMPROVED:
            status = "worse"
        else:
            status = "unchanged"
        row = {"kind": key[0], "cause": key[1] or None, "status": status,
               "before_impact_ns": b["impact_ns"] if b else None, "after_impact_ns": a["impact_ns"] if a else None,
               "title": (a or b)["title"]}
        predicted = (b or {}).get("predicted") or None
        measured = _summary(after).get(f"step_ns_{predicted.get('statistic', a_stat)}") if predicted else None
        if predicted and measured:  # the after-run in the prediction's own statistic
            row["predicted_step_ns"] = predicted["step_ns"]
            row["measured_step_ns"] = measured
            row["prediction_error"] = (measured - predicted["step_ns"]) / predicted["step_ns"]
        findings.append(row)

    def side(s: dict) -> dict:
        summary = _summary(s)
        return {"report": (s.get("report") or {}).get("path"), "step_ns_median": summary.get("step_ns_median"),
                "step_ns_mean": summary.get("step_ns_mean"), "modes": summary.get("modes"),
                "steps_source": (s.get("steps") or {}).get("source"),
                "profiled": "try" not in s,
                "gpu_busy_fraction": summary.get("gpu_busy_fraction"), "findings": len(s.get("findings") or [])}

    # Where one side's steps come in two kinds or are uneven, both sides are compared by their mean (throughput).
    statistic = "mean" if "mean" in (b_stat, a_stat) else "median"
    b_side, a_side = side(before), side(after)
    b_step, a_step = b_side[f"step_ns_{statistic}"], a_side[f"step_ns_{statistic}"]
    out = {"before": b_side, "after": a_side, "step_statistic": statistic,
           "step_change": (a_step - b_step) / b_step if a_step and b_step else None,
           "speedup": (b_step / a_step) if a_step and b_step else None, "findings": findings}
    tried = after.get("try") or {}
    if tried.get("predicted_step_ms") and tried.get("measured_step_ms"):  # a variant nvtx-trace try timed
        out["try"] = {"finding": tried.get("finding"), "knobs": tried.get("knobs"),
                      "predicted_step_ns": int(tried["predicted_step_ms"] * 1e6),
                      "measured_step_ns": int(tried["measured_step_ms"] * 1e6),
                      "prediction_error": tried["measured_step_ms"] / tried["predicted_step_ms"] - 1,
                      "verdict": tried.get("verdict")}
    return out
