"""What a performance engineer does by hand, as a library: plan, profile, import, export, analyze, write.

    plan = runner.plan_run(runner.RunOptions(target=["train.py", "--epochs", "1"]))
    result = runner.execute(plan)          # nsys profile ... python -m nvtx_autotrace train.py --epochs 1
    result.exit_code, result.analysis, result.written

The program runs under ``nsys profile`` with the auto-instrumentation injected:
``python -m nvtx_autotrace script.py`` (or ``-m module``) for a Python program, and a
generated ``sitecustomize`` on ``PYTHONPATH`` for any other command (torchrun, a shell
script), so every Python process that imports torch installs the ranges. Everything
lands in one fresh folder: ``report.nsys-rep``, ``report.sqlite``, ``summary.json``,
``summary.html``. Success is judged by those files, not by nsys's exit code; the
program's own exit code becomes ours.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from nvtx_trace import default_window
from nvtx_trace import nsys as nsys_mod
from nvtx_trace.analysis_options import check_analysis_options
from nvtx_trace.errors import BadReportError, NsysFailedError, NvtxTraceError, UsageError
from nvtx_trace.output_paths import (
    check_folder_writable,
    check_unclaimed,
    claim_folder,
    describe_unreadable,
    write_atomically,
)
from nvtx_trace.target_python import python_probe as _python_probe

Progress = Callable[[str], None]

DEFAULT_OUT_ROOT = "nvtx-trace-out"
REPORT_STEM = "report"
OUTPUT_NAMES = ("report.nsys-rep", "report.sqlite", "summary.json", "summary.html")
# What the analyzer reads. OS-runtime, cuDNN and cuBLAS API tracing cost time in every call of the program
# and file size (a 12-step CPU run: 189 MB of capture with osrt, 1.4 MB without) and feed no analysis:
# add them with --trace when you want them in the Nsight Systems GUI.
TRAINING_TRACES = ("cuda", "nvtx")
# No CPU sampling and no context switches: they multiply the file size and the import time.
QUIET_OPTIONS = ("-s", "none", "--cpuctxsw", "none")
CAPTURE_ENV = "NVTX_AUTOTRACE_CAPTURE"  # read by nvtx_autotrace.capture
NVTX_CAPTURE_RANGE = "capture@nvtx-trace"  # nvtx_autotrace.capture.NSYS_NVTX_CAPTURE (torch-free copy)
CAPTURE_MODES = ("auto", "cuda", "nvtx")


@dataclass
class RunOptions:
    """What the user asked for; ``plan_run`` turns it into a command line."""

    target: list[str]  # script.py args..., module args... (module=True), or any command
    module: bool = False
    python: str | None = None  # interpreter for a script/module (default: this one)
    autotrace: bool = True
    warmup_steps: int | None = None  # capture window: first step profiled
    steps: int | None = None  # capture window: number of steps profiled
    capture_mode: str = "auto"  # auto | cuda | nvtx
    keep_running: bool = False  # after a capture window, let the program run on (default: stop it)
    full: bool = False  # profile the whole run (default without --steps: a window chosen after warm-up)
    trace: list[str] | None = None  # -t list (default: TRAINING_TRACES this nsys supports)
    nsys_args: list[str] = field(default_factory=list)  # extra `nsys profile` options, verbatim
    out: Path | None = None  # the run's folder (default: ./nvtx-trace-out/<name>-<time>)
    out_root: Path = Path(DEFAULT_OUT_ROOT)
    force: bool = False  # reuse an --out folder that already holds outputs
    nsys: str | None = None  # --nsys
    min_gap_ms: float = 1.0
    html_max_points: int = 20_000
    html: bool = True
    autotrace_depth: str | None = None  # NVTX_AUTOTRACE_MODULE_DEPTH for the program (auto, N, -1)
    autotrace_budget: float | None = None  # NVTX_AUTOTRACE_BUDGET_PCT


@dataclass
class Plan:
    """The exact command that will run, its environment and where its outputs go."""

    nsys: nsys_mod.Nsys
    out_dir: Path
    argv: list[str]  # the program as nsys launches it
    env: dict[str, str]
    trace: list[str]
    extra: list[str]  # nsys profile options after -t
    capture: str  # what will be profiled, in words
    mode: str  # "script" | "module" | "command"
    notes: list[str] = field(default_factory=list)  # one-line warnings for the user
    capture_window: tuple[int, int] | None = None
    site_dir: Path | None = None  # generated sitecustomize (command mode), removed after the run
    options: RunOptions | None = None
    window_file: Path | None = None  # the default window's decisions (nvtx_trace.default_window)

    @property
    def stem(self) -> Path:
        return self.out_dir / REPORT_STEM

    def path(self, name: str) -> Path:
        return self.out_dir / name

    def nsys_command(self) -> list[str]:
        return nsys_mod.profile_command(self.nsys, self.stem, self.trace, self.extra, self.argv)


@dataclass
class RunResult:
    plan: Plan
    exit_code: int  # the program's (130 after Ctrl-C when the program gave none)
    profile: nsys_mod.ProfileResult | None = None
    sqlite: Path | None = None
    analysis: object | None = None  # nvtx_trace.analyzer.Analysis
    written: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # stages that failed, one line each
    error: NvtxTraceError | None = None  # the first stage failure, for the exit code when the program succeeded
    window: default_window.Outcome | None = None  # the default window: which steps were profiled and why


# ---------------------------------------------------------------- planning


def classify(target: Sequence[str], module: bool) -> str:
    """"module" with -m; "script" for a .py file (or a non-executable file); else "command"."""
    if module:
        return "module"
    first = Path(target[0])
    if first.suffix in (".py", ".pyw") or (first.is_file() and not os.access(first, os.X_OK)):
        return "script"
    return "command"


def run_name(target: Sequence[str], mode: str) -> str:
    """A folder-name stem from what runs: ``train`` / ``pkg.mod`` / ``torchrun-train``."""
    if mode == "module":
        name = target[0]
    elif mode == "script":
        name = Path(target[0]).stem
    else:
        name = Path(target[0]).name
        script = next((Path(a).stem for a in target[1:] if a.endswith(".py")), None)
        if script and script != name:
            name = f"{name}-{script}"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def output_dir(opts: RunOptions, mode: str, now: float | None = None) -> Path:
    """``--out`` as given (refused when it already holds outputs, unless --force), or a fresh folder."""
    if opts.out is not None:
        out = Path(opts.out)
        problem = describe_unreadable(out)
        if problem:
            raise UsageError(f"--out {out} {problem}; give a folder")
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder")
        check_folder_writable(out)
        check_unclaimed(out)
        taken = [n for n in OUTPUT_NAMES if (out / n).exists()]
        if taken and not opts.force:
            raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
        return out.resolve()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path(opts.out_root) / f"{run_name(opts.target, mode)}-{stamp}"
    check_folder_writable(base)
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out.resolve()


def _has_cuda_device() -> bool:
    """A cheap guess without importing torch: the NVIDIA driver's device node."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def _autotrace_env(opts: RunOptions) -> dict[str, str]:
    """--autotrace-depth/--autotrace-budget as the variables nvtx_autotrace reads, checked here first."""
    env = {}
    if opts.autotrace_depth is not None:
        text = str(opts.autotrace_depth).strip().lower()
        if text != "auto" and not (text.lstrip("-").isdigit() and int(text) >= -1):
            raise UsageError(f"--autotrace-depth {opts.autotrace_depth!r}: expected auto, -1 (all) or a depth >= 0")
        env["NVTX_AUTOTRACE_MODULE_DEPTH"] = text
    if opts.autotrace_budget is not None:
        if not 0 < opts.autotrace_budget <= 100:
            raise UsageError(f"--autotrace-budget {opts.autotrace_budget}: expected a percentage, > 0 and <= 100")
        env["NVTX_AUTOTRACE_BUDGET_PCT"] = repr(float(opts.autotrace_budget))
    if env and not opts.autotrace:
        raise UsageError("--autotrace-depth/--autotrace-budget set nvtx_autotrace's ranges; drop --no-autotrace")
    return env


def plan_run(opts: RunOptions, nsys: nsys_mod.Nsys | None = None, environ=None,
             now: float | None = None) -> Plan:
    """Check the request, find nsys, and build the command line, environment and output folder."""
    if not opts.target:
        raise UsageError("nothing to run; example: nvtx-trace run train.py --epochs 1")
    if (opts.warmup_steps is None) != (opts.steps is None):
        raise UsageError("a capture window needs both --warmup-steps N and --steps M")
    if opts.steps is not None and (opts.steps < 1 or opts.warmup_steps < 0):
        raise UsageError("--steps must be >= 1 and --warmup-steps >= 0")
    if opts.capture_mode not in CAPTURE_MODES:
        raise UsageError(f"--capture-mode must be one of {', '.join(CAPTURE_MODES)}")
    check_analysis_options(opts.min_gap_ms)
    if opts.full and opts.steps is not None:
        raise UsageError("--full profiles everything: drop --warmup-steps/--steps, or --full")
    if opts.steps is not None and not opts.autotrace:
        raise UsageError("--warmup-steps/--steps count steps with nvtx_autotrace; drop --no-autotrace")
    autotrace_env = _autotrace_env(opts)
    mode = classify(opts.target, opts.module)
    if mode == "script" and not Path(opts.target[0]).is_file():
        raise UsageError(f"{opts.target[0]}: no such script")
    if mode == "command" and shutil.which(opts.target[0]) is None:
        raise UsageError(f"{opts.target[0]}: command not found")
    nsys = nsys or nsys_mod.find_nsys(opts.nsys)
    env = dict(os.environ if environ is None else environ)
    env.update(autotrace_env)
    python = opts.python or sys.executable
    notes: list[str] = []
    if opts.python and shutil.which(opts.python) is None and not Path(opts.python).is_file():
        raise UsageError(f"--python {opts.python}: not found")

    probe = _python_probe(python)
    if "error" in probe:
        raise UsageError(probe["error"])
    problem = nsys_mod.nvtx_problem(probe.get("nvtx"), nsys.version)
    if opts.autotrace and not probe.get("autotrace"):
        raise UsageError(f"nvtx_autotrace is not importable by {python}; pip install nvtx-trace there, "
                         "or pass --no-autotrace")
    # a long run that would record no range of ours is refused before it starts, with the fix
    install = f"{python} -m pip install 'nvtx==0.2.11'"
    if opts.autotrace and not probe.get("nvtx"):
        raise UsageError(f"the nvtx package is missing for {python}, so no range would be recorded; "
                         f"install it with: {install} (a version every nsys records), or pass --no-autotrace")
    if opts.autotrace and problem:
        raise UsageError(f"{problem}; install the one it records with: {install}, or pass --no-autotrace")
    if problem:
        notes.append(problem)

    if mode == "script":
        argv = [python, *(["-m", "nvtx_autotrace"] if opts.autotrace else []), *opts.target]
    elif mode == "module":
        argv = [python, *(["-m", "nvtx_autotrace"] if opts.autotrace else []), "-m", *opts.target]
    else:
        argv = list(opts.target)

    site_dir = None
    if mode == "command" and opts.autotrace:
        # named now, made by execute(): a plan that is refused or never run leaves nothing in /tmp
        site_dir = Path(tempfile.gettempdir()) / f"nvtx-trace-site-{os.getpid()}-{secrets.token_hex(6)}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir), env.get("PYTHONPATH")) if p)

    supported = nsys_mod.supported_options(nsys)
    trace = list(opts.trace) if opts.trace else nsys_mod.pick_traces(nsys, TRAINING_TRACES)
    if "nvtx" not in trace and opts.autotrace:
        notes.append("NVTX is not traced (-t without nvtx): the autotrace ranges will not be recorded")
    extra = list(QUIET_OPTIONS)
    if "--trace-fork-before-exec" in supported or not supported:
        extra += ["--trace-fork-before-exec=true"]  # DataLoader workers are forked without exec

    window, capture, window_file = None, "the whole run", None
    if opts.steps is not None or default_window.applies(opts):
        cmode = opts.capture_mode
        if cmode == "auto":
            # cudaProfilerStart needs a GPU *and* a CUDA build of torch (a CPU wheel beside a driver is common)
            cmode = "cuda" if (_has_cuda_device() and probe.get("torch_cuda") and "cuda" in trace) else "nvtx"
        if cmode == "cuda":
            extra += ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
            how = "cudaProfilerStart/Stop"
        else:
            if "nvtx" not in trace:
                trace.append("nvtx")
            extra += ["--capture-range=nvtx", "--nvtx-capture", NVTX_CAPTURE_RANGE, "--capture-range-end=stop"]
            env.setdefault("NSYS_NVTX_PROFILER_REGISTER_ONLY", "0")
            how = f"an NVTX range {NVTX_CAPTURE_RANGE}"
    if opts.steps is not None:
        window, last = (opts.warmup_steps, opts.steps), opts.warmup_steps + opts.steps - 1
        env[CAPTURE_ENV] = f"{opts.warmup_steps}:{opts.steps}:{cmode}" + ("" if opts.keep_running else ":exit")
        capture = (f"steps {opts.warmup_steps}-{last} only (started/stopped at step boundaries with {how})"
                   + ("" if opts.keep_running else "; the program is stopped after them (--keep-running: not)"))
    elif default_window.applies(opts):
        window_file, capture = default_window.arm(env, cmode, opts.keep_running)
    extra += list(opts.nsys_args)

    out_dir = output_dir(opts, mode, now)
    return Plan(nsys=nsys, out_dir=out_dir, argv=argv, env=env, trace=trace, extra=extra, capture=capture,
                mode=mode, notes=notes, capture_window=window, site_dir=site_dir, options=opts,
                window_file=window_file)


SITECUSTOMIZE = '''\
"""Generated by nvtx-trace run: install nvtx_autotrace in every Python process that imports
torch, then run the sitecustomize this file hides (if any). Delete-safe: a temporary folder."""
import os as _os
import sys as _sys


def _nvtx_trace_chain():
    import importlib.machinery, importlib.util
    here = _os.path.dirname(_os.path.abspath(__file__))
    path = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


class _NvtxTraceWatch:
    """Installs nvtx_autotrace right after `import torch` finishes, in processes that use torch only."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        _sys.meta_path.remove(self)
        import importlib.util
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            try:
                import nvtx_autotrace  # noqa: F401  importing installs it
            except Exception as exc:
                print(f"nvtx-trace: nvtx_autotrace not installed in pid {_os.getpid()}: {exc}",
                      file=_sys.stderr)

        spec.loader.exec_module = exec_module
        return spec


if "torch" in _sys.modules:
    import nvtx_autotrace  # noqa: F401
else:
    _sys.meta_path.insert(0, _NvtxTraceWatch())
try:
    _nvtx_trace_chain()
finally:
    del _nvtx_trace_chain
'''


def write_sitecustomize(directory: Path) -> Path:
    """A ``sitecustomize.py`` that injects nvtx_autotrace into any Python started with it on PYTHONPATH."""
    path = Path(directory) / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE)
    return path


# ---------------------------------------------------------------- running


def execute(plan: Plan, progress: Progress | None = None) -> RunResult:
    """Profile, then (even when the program failed or was interrupted) import, export, analyze and write."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    release = claim_folder(plan.out_dir)
    try:
        result = _execute(plan, progress)
        if result.window and result.window.ended_in_warmup:  # nothing captured, and a program that short
            notice, window = default_window.ran_again(result.window)  # costs little to profile in full
            if progress:
                progress(notice)
            result = _execute(default_window.full_plan(plan), progress)
            result.window = window
        return result
    finally:
        release()


def _execute(plan: Plan, progress: Progress | None) -> RunResult:
    opts = plan.options or RunOptions(target=plan.argv)
    if plan.site_dir is not None:
        plan.site_dir.mkdir(mode=0o700)
        write_sitecustomize(plan.site_dir)
    try:
        prof = nsys_mod.profile(plan.nsys, plan.argv, plan.stem, trace=plan.trace, extra=plan.extra,
                                env=plan.env, progress=progress)
    finally:
        if plan.site_dir is not None:
            shutil.rmtree(plan.site_dir, ignore_errors=True)
    code = prof.returncode
    window = default_window.outcome(plan.window_file, code)
    if window and not window.opened and prof.rep is None:
        prof.problem = window.line
    if code < 0 and not prof.interrupted and prof.rep is None:  # nsys was killed before writing a report
        result = RunResult(plan=plan, exit_code=0, profile=prof)
        _fail(result, NsysFailedError(_nsys_killed(prof)))
        return result
    if prof.interrupted and code in (0, 130, 143, -2, -15):
        code = 128 + (prof.signal or signal.SIGINT)  # 130 for Ctrl-C, 143 for SIGTERM, as a shell says
    elif code < 0:  # killed by a signal, shell-style
        code = 128 - code
    result = RunResult(plan=plan, exit_code=code, profile=prof, window=window)
    if prof.rep is None:
        _fail(result, NsysFailedError(prof.problem or "nsys produced no report"))
        return result
    result.written.append(prof.rep)
    if prof.qdstrm is not None and prof.qdstrm.exists():
        prof.qdstrm.unlink()  # the raw stream (often 100+ MB); nsys deletes it too once imported
    try:
        result.sqlite = nsys_mod.export_sqlite(plan.nsys, prof.rep, plan.path("report.sqlite"), progress=progress)
        result.written.append(result.sqlite)
    except NvtxTraceError as exc:
        _fail(result, exc)
        return result
    if progress:
        progress("Analyzing…")
    from nvtx_trace.analyzer import analyze

    try:
        result.analysis = analyze(result.sqlite, min_gap_ms=opts.min_gap_ms,
                                  warmup_steps=0 if plan.capture_window or (window and window.stepped) else None)
    except NvtxTraceError as exc:
        _fail(result, exc)
        return result
    write_summaries(result, html=opts.html, progress=progress, max_points=opts.html_max_points)
    return result


def _nsys_killed(prof) -> str:
    """One line: nsys died of a signal nobody sent through us; what is kept, and what still runs."""
    try:
        sig = signal.Signals(-prof.returncode).name
    except ValueError:
        sig = f"signal {-prof.returncode}"
    kept = f"the capture so far is kept as {prof.qdstrm}" if prof.qdstrm else "no report was written"
    line = f"nsys was killed ({sig}) while profiling; {kept}"
    alive = nsys_mod.group_members(prof.pid) if prof.pid else []
    if alive:
        line += (f"; the program still runs without the profiler (pid {', '.join(map(str, alive))}): "
                 f"left alone, stop it with kill -INT -{prof.pid}")
    return line


def _fail(result: RunResult, exc: NvtxTraceError) -> None:
    result.problems.append(str(exc))
    result.error = result.error or exc


def write_summaries(result: RunResult, html: bool = True, progress: Progress | None = None,
                    max_points: int = 20_000) -> None:
    """summary.json always; summary.html when the HTML reporter is available."""
    from nvtx_trace.report import json as json_report

    out = result.plan.path("summary.json")
    write_atomically(out, json_report.render(result.analysis))
    result.written.append(out)
    if not html:
        return
    try:
        from nvtx_trace.report import html as html_report
    except ImportError as exc:
        result.problems.append(f"no HTML summary: {exc}")
        return
    if progress:
        progress("Writing the HTML summary…")
    out = result.plan.path("summary.html")
    try:
        html_report.write(result.analysis, out, max_points=max_points)
    except NvtxTraceError as exc:
        _fail(result, exc)
        return
    result.written.append(out)


def next_command(result: RunResult) -> str | None:
    """What to type next, after the files are written."""
    html = result.plan.path("summary.html")
    if html in result.written:
        return f"open {_display(html)}"
    if isinstance(result.error, BadReportError):
        return None  # the report holds nothing to analyze: analyzing it again would say the same
    if result.sqlite:
        return f"nvtx-trace analyze {_display(result.sqlite)} --html {_display(html)}"
    if result.profile and result.profile.rep:
        return f"nvtx-trace analyze {_display(result.profile.rep)}"
    return None


def _display(path: Path) -> str:
    """A path relative to the working directory when it is under it (shorter to type)."""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        return shlex.quote(str(rel))
    except ValueError:
        return shlex.quote(str(path))
