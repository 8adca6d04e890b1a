"""What a performance engineer does by hand, as a library: plan, profile, import, export, analyze, write.

    plan = runner.plan_run(runner.RunOptions(target=["train.py", "--epochs", "1"]))
    result = runner.execute(plan)          # nsys profile ... python -m nvtx_autotrace train.py --epochs 1
    result.exit_code, result.analysis, result.written

The program runs under ``nsys profile`` with the auto-instrumentation injected:
``python -m nvtx_autotrace script.py`` (or ``-m module``) for a Python program, and the
package's ``sitecustomize`` (nvtx_trace/capture/inject/) on ``PYTHONPATH`` for any other
command (torchrun, a shell script), so every Python process that imports torch installs
the ranges. Everything lands in one fresh folder: ``report.nsys-rep``, ``report.sqlite``,
``summary.json``, ``summary.html`` and nsys's own output in ``nsys.log``.

    plan.py     validation, the probe of the target Python, argv, environment, output folder
    execute.py  profiling, import, export, analysis, summaries; exit codes
"""

from nvtx_trace.runner.execute import RunResult, display, execute, next_command, write_summaries
from nvtx_trace.runner.plan import (
    CAPTURE_ENV,
    CAPTURE_MODES,
    DEFAULT_OUT_ROOT,
    OUTPUT_NAMES,
    QUIET_OPTIONS,
    REPORT_STEM,
    TRAINING_TRACES,
    Plan,
    RunOptions,
    classify,
    output_dir,
    plan_run,
    run_name,
)

__all__ = ["CAPTURE_ENV", "CAPTURE_MODES", "DEFAULT_OUT_ROOT", "OUTPUT_NAMES", "QUIET_OPTIONS", "REPORT_STEM",
           "TRAINING_TRACES", "Plan", "RunOptions", "RunResult", "classify", "display", "execute",
           "next_command", "output_dir", "plan_run", "run_name", "write_summaries"]
