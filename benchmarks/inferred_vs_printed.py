"""Steps the analyzer inferred vs the iteration times the program printed itself.

The check behind issue 16 on a GPU: run a trainer under plain ``nsys profile``
(no nvtx_autotrace, no step ranges), then compare what ``nvtx-trace analyze``
found with the program's own ``STEPS t1 t2 ...`` line (ms per iteration, as
programs/gpt2_train.py prints it):

    nsys profile -t cuda,nvtx -o /tmp/g python programs/gpt2_train.py > /tmp/g.log
    nsys export --type sqlite -o /tmp/g.sqlite /tmp/g.nsys-rep
    python benchmarks/inferred_vs_printed.py /tmp/g.sqlite /tmp/g.log --warmup 4

Prints the two step counts, the two steady medians and their ratio, where the
window starts against start-up, and every finding with its kind and window, so
a start-up event reported per step would show.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nvtx_trace.analyzer import analyze  # noqa: E402
from nvtx_trace.analyzer.summary import to_dict  # noqa: E402


def printed_steps(log: Path) -> list[float]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("STEPS "):
            return [float(x) for x in line.split()[1:]]
    raise SystemExit(f"{log}: no 'STEPS ...' line (the program's per-iteration times in ms)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("log", type=Path, help="the program's output, with its STEPS line")
    p.add_argument("--warmup", type=int, default=4, help="the program's own warm-up iterations, left out")
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    printed = printed_steps(args.log)
    analysis = analyze(args.report)
    summary = to_dict(analysis)
    steps = {**summary["steps"], **(summary["steps"].get("summary") or {})}
    printed_median = statistics.median(printed[args.warmup:]) * 1e6
    inferred_median = steps.get("step_ns_median")
    figures = {
        "printed_steps": len(printed),
        "inferred_steps": steps.get("steps"),
        "steps_source": steps.get("source"),
        "steps_confidence": steps.get("confidence"),
        "printed_step_ns_median": int(printed_median),
        "inferred_step_ns_median": inferred_median,
        "ratio": (inferred_median / printed_median) if inferred_median else None,
        "window": summary["window"],
        "startup_ns": (summary.get("startup") or {}).get("duration_ns"),
        "findings": [{"kind": f["kind"], "impact_ns": f["impact_ns"], "title": f["title"]}
                     for f in summary["findings"]],
    }
    print(f"steps: printed {figures['printed_steps']}, inferred {figures['inferred_steps']} "
          f"({figures['steps_source']}, confidence {figures['steps_confidence']})")
    if inferred_median:
        print(f"steady median: printed {printed_median / 1e6:.1f} ms, inferred {inferred_median / 1e6:.1f} ms, "
              f"ratio {figures['ratio']:.3f}")
    print(f"window: {summary['window']}; start-up {figures['startup_ns']} ns")
    for f in figures["findings"]:
        print(f"finding {f['kind']}: {f['impact_ns'] / 1e6:.1f} ms  {f['title']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
