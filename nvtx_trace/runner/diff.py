"""Two runs side by side: did the change do what the first run's findings promised?

Each side is a report (.sqlite, .nsys-rep), a summary.json, or a run folder (its summary.json,
else its report.sqlite). Compared: the steady step median and GPU busy share, each finding by
kind (and cause, for CPU-bound ones) as resolved / improved / unchanged / worse / new, and the
before-run's predicted step beside the step measured after.
"""

from __future__ import annotations

import json
from pathlib import Path

from nvtx_trace.analyzer.measures.step_times import typical_step_ns
from nvtx_trace.errors import BadReportError, UsageError

IMPROVED = 0.8  # an impact below this x the earlier one is an improvement; above 1/IMPROVED, worse


RUN_FILES = ("summary.json", "report.sqlite", "report.nsys-rep")  # what `run` writes into its folder


def refuse_same_run(before: Path, after: Path) -> None:
    """BEFORE and AFTER must be two runs: the same file twice, or a run folder and a file of its own (its
    summary.json, its report), compares a run with itself and would say "unchanged" about nothing."""
    def run_of(path: Path) -> Path | None:
        path = Path(path)
        if not path.exists():
            return None  # load_summary says what is wrong with it
        path = path.resolve()
        return path.parent if path.is_file() and path.name in RUN_FILES else path

    b, a = run_of(before), run_of(after)
    if b is not None and b == a:
        raise UsageError(f"{before} and {after} are the same run ({b}); give the run before the change and the "
                         "run after it")


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
        except RecursionError:
            raise BadReportError(f"{path}: not a summary.json (nested too deeply to read)") from None
        if not isinstance(data, dict) or "findings" not in data:
            what = "no findings" if isinstance(data, dict) else f"a JSON {type(data).__name__}, not an object"
            raise BadReportError(f"{path}: not an nvtx-trace summary.json ({what})")
        check_summary(path, data)
        return data
    from nvtx_trace.analyzer import analyze
    from nvtx_trace.analyzer.ranks.inputs import expand
    from nvtx_trace.analyzer.summary import to_dict
    from nvtx_trace.capture.export import as_sqlite

    return json.loads(json.dumps(to_dict(analyze([as_sqlite(p) for p in expand(path)]))))


def check_summary(path: Path, data: dict) -> None:
    """Every field ``compare`` reads has the type it reads (a summary.json edited by hand or by another tool):
    BadReportError naming the file and the first field that has not, instead of a TypeError deep in compare."""

    def bad(field: str, want: str, got) -> BadReportError:
        shown = json.dumps(got, allow_nan=True)
        return BadReportError(f"{path}: {field} should be {want}, not {shown[:40]}"
                              f"{'...' if len(shown) > 40 else ''}; give a summary.json written by nvtx-trace")

    def check(value, field: str, want: str, ok, optional: bool = True) -> None:
        if not ((optional and value is None) or ok(value)):
            raise bad(field, want + (" or null" if optional else ""), value)

    def number(low: float = 0) -> object:  # finite, and within the int64 nanoseconds the tool writes
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v < 2 ** 63 \
            and v == v and v not in (float("inf"), float("-inf"))

    def is_dict(v) -> bool:
        return isinstance(v, dict)

    positive = lambda v: number()(v) and v > 0  # noqa: E731
    check(data.get("report"), "report", "an object", is_dict)
    check((data.get("report") or {}).get("path"), "report.path", "a text", lambda v: isinstance(v, str))
    check(data.get("steps"), "steps", "an object", is_dict)
    steps = data.get("steps") or {}
    check(steps.get("source"), "steps.source", "a text", lambda v: isinstance(v, str))
    check(steps.get("summary"), "steps.summary", "an object", is_dict)
    summary = steps.get("summary") or {}
    for key in ("step_ns_median", "step_ns_mean"):
        check(summary.get(key), f"steps.summary.{key}", "a positive number of ns", positive)
    check(summary.get("statistic"), "steps.summary.statistic", "'median' or 'mean'", lambda v: v in STATISTICS)
    check(summary.get("modes"), "steps.summary.modes", "an object", is_dict)
    check(summary.get("gpu_busy_fraction"), "steps.summary.gpu_busy_fraction", "a number from 0 to 1",
          lambda v: number()(v) and v <= 1)
    check(data["findings"], "findings", "a list", lambda v: isinstance(v, list), optional=False)
    for i, finding in enumerate(data["findings"]):
        at = f"findings[{i}]"
        check(finding, at, "an object", is_dict, optional=False)
        check(finding.get("kind"), f"{at}.kind", "a text", lambda v: isinstance(v, str) and v, optional=False)
        check(finding.get("title"), f"{at}.title", "a text", lambda v: isinstance(v, str), optional=False)
        check(finding.get("impact_ns"), f"{at}.impact_ns", "a number of ns", number(), optional=False)
        check(finding.get("evidence"), f"{at}.evidence", "an object", is_dict)
        check((finding.get("evidence") or {}).get("cause"), f"{at}.evidence.cause", "a text",
              lambda v: isinstance(v, str))
        check(finding.get("predicted"), f"{at}.predicted", "an object", is_dict)
        if finding.get("predicted"):
            check(finding["predicted"].get("step_ns"), f"{at}.predicted.step_ns", "a positive number of ns",
                  positive, optional=False)
            check(finding["predicted"].get("statistic"), f"{at}.predicted.statistic", "'median' or 'mean'",
                  lambda v: v in STATISTICS)
            check(finding["predicted"].get("saving_ns"), f"{at}.predicted.saving_ns", "a number of ns",
                  number(-2 ** 63))
    check(data.get("try"), "try", "an object", is_dict)
    for key in ("predicted_step_ms", "measured_step_ms"):
        check((data.get("try") or {}).get(key), f"try.{key}", "a positive number of ms", positive)
    check((data.get("try") or {}).get("predicted_saving_ms"), "try.predicted_saving_ms", "a number of ms",
          number(-2 ** 63))


STATISTICS = ("median", "mean")


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
        stat = predicted.get("statistic", a_stat) if predicted else None
        measured = _summary(after).get(f"step_ns_{stat}") if predicted else None
        if predicted and measured:  # the after-run in the prediction's own statistic, named (the head may use another)
            row["predicted_step_ns"] = predicted["step_ns"]
            row["predicted_saving_ns"] = predicted.get("saving_ns")
            row["measured_step_ns"] = measured
            row["prediction_statistic"] = stat
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
                      "predicted_saving_ns": (int(round(tried["predicted_saving_ms"] * 1e6))
                                              if tried.get("predicted_saving_ms") is not None else None),
                      "measured_step_ns": int(tried["measured_step_ms"] * 1e6),
                      "prediction_error": tried["measured_step_ms"] / tried["predicted_step_ms"] - 1,
                      "verdict": tried.get("verdict")}
    return out
