"""What one row of the run history holds: a profiled run (its summary's step time and findings, the script's
commit, its Python's torch), each variant ``try`` timed, each stage ``tune`` tried. Kept apart from the database
(history_store.py), which stores any row of its schema, and from when the verbs record (history.py).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path


def script_key(target: list[str], mode: str, cwd: Path) -> str:
    """What "the same script" means: its absolute path, ``-m module`` (with the folder it runs in), or the
    command up to its first .py argument, made absolute (``torchrun --nproc_per_node=2 /abs/train.py``: the
    script's own arguments may change between runs, as they do for a script)."""
    if mode == "script":
        return str((cwd / target[0]).resolve())
    if mode == "module":
        return f"-m {target[0]} @ {cwd}"
    words = []
    for word in target:
        if word.endswith(".py") and (cwd / word).is_file():
            words.append(str((cwd / word).resolve()))
            break
        words.append(word)
    return shlex.join(words)


def _git(folder: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the repository holding ``folder``; (None, None) outside one or without git."""
    git = shutil.which("git")
    if git is None:
        return None, None
    try:
        head = subprocess.run([git, "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, stdin=subprocess.DEVNULL)
        if head.returncode != 0:
            return None, None
        status = subprocess.run([git, "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
        return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def _target_python(plan) -> str | None:
    """The interpreter that ran the program: argv[0] for a script or module, a command's python shebang."""
    if plan.mode in ("script", "module"):
        return plan.argv[0]
    first = shutil.which(plan.argv[0])
    if first is None:
        return None
    if re.search(r"python[\d.]*$", Path(first).name):
        return first
    try:
        with open(first, "rb") as fh:
            line = fh.readline(200).decode("utf-8", "replace")
    except OSError:
        return None
    match = re.match(r"#!\s*(\S*python[\d.]*)\s*$", line.strip())
    return match.group(1) if match else None


def knobs(summary: dict) -> dict:
    """Settings the report shows evidence of (DataLoader workers per loader): each knob's ``observed``."""
    from nvtx_trace import knobs as declared

    return declared.observed(summary)


def run_row(plan, exit_code: int, started: float, summary: dict | None, cwd: Path | None = None,
            window: str | None = None, tried: dict | None = None) -> dict:
    """The ``runs`` row of one finished run (``summary``: its summary.json, None when none was written)."""
    from nvtx_trace.capture import target_python

    cwd = Path(cwd or os.getcwd()).resolve()
    opts = plan.options
    target = list(opts.target) if opts else list(plan.argv)
    where = (cwd / target[0]).resolve().parent if plan.mode == "script" else cwd
    commit, dirty = _git(where)
    python = _target_python(plan)
    probe = target_python.probe(python) if python else {}
    stats = ((summary or {}).get("steps") or {}).get("summary") or {}
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "kind": "run", "tried": _knob_text(tried),
        "script": script_key(target, plan.mode, cwd), "mode": plan.mode,
        "args": json.dumps(target[1:]), "cwd": str(cwd), "git_commit": commit,
        "git_dirty": None if dirty is None else int(dirty),
        "torch_version": probe.get("torch"), "cuda_version": probe.get("cuda_version"),
        "knobs": json.dumps(knobs(summary or {})), "window": window,
        "steps": stats.get("steps"), "step_ns_median": stats.get("step_ns_median"),
        "step_ns_mean": stats.get("step_ns_mean"), "step_modes": json.dumps(stats.get("modes")),
        "gpu_busy_fraction": stats.get("gpu_busy_fraction"),
        "findings_count": len((summary or {}).get("findings") or []),
        "out_dir": str(plan.out_dir), "exit_code": exit_code,
        "duration_s": round(time.time() - started, 3),
    }


def _knob_text(knobs: dict | None) -> str | None:
    from nvtx_trace import knobs as declared

    return declared.text(knobs) if knobs else None


def try_rows(result: dict, program: list[str], folder: Path, started: float, cwd: Path | None = None) -> list[dict]:
    """One ``runs`` row per variant ``nvtx-trace try`` timed (the baseline too): plain steps, no findings; the
    variant's prediction and verdict in ``try_*`` columns."""
    from nvtx_trace.files import variant_folder

    cwd = Path(cwd or os.getcwd()).resolve()
    commit, dirty = _git((cwd / program[0]).resolve().parent)
    rows = []
    for r in result["variants"]:
        stat, step = r["statistic"], r["measured_step_ms"]
        rows.append({
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "kind": "try", "tried": _knob_text(r["knobs"]) or "baseline",
            "script": script_key(program, "script", cwd), "mode": "script", "args": json.dumps(program[1:]),
            "cwd": str(cwd), "git_commit": commit, "git_dirty": None if dirty is None else int(dirty),
            "knobs": json.dumps(r["knobs"]), "window": f"plain (no profiler), {len(r['rounds_ms'])} round(s)",
            "steps": None, f"step_ns_{stat}": int(step * 1e6) if step else None,
            "gpu_busy_fraction": None, "findings_count": 0,
            "out_dir": str(folder / variant_folder(r["label"])), "exit_code": 0 if step else 1,
            "duration_s": round(time.time() - started, 3),
            "try_speedup": r["speedup"], "try_finding": r["finding"],
            "try_predicted_step_ns": int(r["predicted_step_ms"] * 1e6) if r["predicted_step_ms"] else None,
            "try_predicted_saving_ns": _ns(r.get("predicted_saving_ms")) if r.get("predicted_step_ms") else None,
            "try_verdict": r["verdict"]})
    return rows


def tune_rows(result: dict, program: list[str], folder: Path, started: float, cwd: Path | None = None) -> list[dict]:
    """One ``runs`` row per stage of ``nvtx-trace tune`` that timed a knob: the configuration with it (``tried``),
    its plain step, its finding's prediction, and ``kept``/``rejected`` as the verdict."""
    from nvtx_trace.runner.plan import classify

    cwd = Path(cwd or os.getcwd()).resolve()
    module = program[0] == "-m"
    mode = classify(program[1:] if module else program, module)
    commit, dirty = _git(cwd if mode != "script" else (cwd / program[0]).resolve().parent)
    rows = []
    for s in result["stages"]:
        if not s["knobs"]:
            continue
        stat, step = s.get("statistic") or "median", s.get("measured_step_ms")
        rows.append({
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "kind": "tune", "tried": _knob_text({**s["configuration"], **s["knobs"]}),
            "script": script_key(program[1:] if module else program, mode, cwd),
            "mode": mode, "args": json.dumps(program[2:] if module else program[1:]),
            "cwd": str(cwd), "git_commit": commit, "git_dirty": None if dirty is None else int(dirty),
            "knobs": json.dumps({**s["configuration"], **s["knobs"]}),
            "window": f"plain (no profiler), tune stage {s['stage']}, {len(s['rounds_ms']['variant'])} round(s)",
            "steps": None, f"step_ns_{stat}": int(step * 1e6) if step else None,
            "gpu_busy_fraction": None, "findings_count": 0, "out_dir": str(folder / f"stage-{s['stage']}"),
            "exit_code": 0 if step else 1, "duration_s": s["elapsed_s"],
            "try_speedup": s.get("speedup"), "try_finding": s["finding"],
            "try_predicted_step_ns": int(s["predicted_step_ms"] * 1e6) if s["predicted_step_ms"] else None,
            "try_predicted_saving_ns": _ns(s.get("predicted_saving_ms")),
            "try_verdict": "kept" if s["kept"] else "rejected"})
    return rows


def _ns(value_ms: float | None) -> int | None:
    """A saving in ms as the history keeps it, in ns (the finding's own integer, without float drift)."""
    return None if value_ms is None else int(round(value_ms * 1e6))


def finding_rows(summary: dict | None) -> list[dict]:
    return [{"kind": f["kind"], "cause": (f.get("evidence") or {}).get("cause"), "impact_ns": f.get("impact_ns"),
             "title": f.get("title"), "predicted_step_ns": (f.get("predicted") or {}).get("step_ns"),
             "predicted_saving_ns": (f.get("predicted") or {}).get("saving_ns"),
             "recommend": json.dumps(f.get("recommend"))} for f in (summary or {}).get("findings") or []]

