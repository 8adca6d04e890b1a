"""Planning a run: check the request, probe the program's Python, build the nsys command line.

Nothing is written and nothing is started here (only the probe of the target Python runs):
a refused request leaves no folder and no temporary file. ``execute.py`` carries the plan out.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from nvtx_trace import knobs, names
from nvtx_trace.analyzer.options import AnalysisOptions, parse_options
from nvtx_trace.capture import INJECT_DIR, target_python, torchrun
from nvtx_trace.capture.locate import Nsys, find_nsys, nvtx_problem, pick_traces, supported_options
from nvtx_trace.capture.nsys_log import LOG_NAME
from nvtx_trace.capture.profile import profile_command
from nvtx_trace.errors import UsageError
from nvtx_trace.files import check_folder_writable, check_unclaimed, deep_tmp_note, describe_unreadable
from nvtx_trace.runner import default_window

DEFAULT_OUT_ROOT = "nvtx-trace-out"
REPORT_STEM = "report"
REPORT_OUTPUTS = tuple(REPORT_STEM + s for s in (".nsys-rep", ".qdstrm", ".sqlite"))  # one report for the node
OUTPUT_NAMES = ("report.nsys-rep", "report.sqlite", "summary.json", "summary.html")
# What the analyzer reads. OS-runtime, cuDNN and cuBLAS API tracing cost time in every call of the program
# and file size (a 12-step CPU run: 189 MB of capture with osrt, 1.4 MB without) and feed no analysis:
# add them with --trace when you want them in the Nsight Systems GUI.
TRAINING_TRACES = ("cuda", "nvtx")
# No CPU sampling and no context switches: they multiply the file size and the import time.
QUIET_OPTIONS = ("-s", "none", "--cpuctxsw", "none")
CAPTURE_ENV = names.CAPTURE_ENV  # read by nvtx_autotrace.capture_window
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
    per_rank: bool = False  # torchrun: one nsys per rank inside it (one report each), not one around it
    tried: dict | None = None  # knobs nvtx_autotrace applies (run --try; docs/try.md), parsed


@dataclass
class Plan:
    """The exact command that will run, its environment and where its outputs go."""

    nsys: Nsys
    out_dir: Path
    argv: list[str]  # the program as nsys launches it
    env: dict[str, str]
    trace: list[str]
    extra: list[str]  # nsys profile options after -t
    capture: str  # what will be profiled, in words
    mode: str  # "script" | "module" | "command"
    notes: list[str] = field(default_factory=list)  # one-line warnings for the user
    capture_window: tuple[int, int] | None = None
    site_dir: Path | None = None  # the sitecustomize folder put on PYTHONPATH (command mode)
    options: RunOptions | None = None
    window_file: Path | None = None  # the default window's decisions (nvtx_trace.runner.default_window)
    launcher: list[str] = field(default_factory=list)  # per rank: torchrun ... --no-python, nsys inside it
    ranks: int | None = None  # how many rank reports this host should write, when the launch says
    analysis: AnalysisOptions = field(default_factory=AnalysisOptions)  # how the report will be analyzed

    @property
    def stem(self) -> Path:
        """``report``, or ``rank%q{RANK}`` (nsys names each rank's report) when nsys runs per rank."""
        return torchrun.rank_stem(self.out_dir) if self.launcher else self.out_dir / REPORT_STEM

    def path(self, name: str) -> Path:
        return self.out_dir / name

    def owns(self, path) -> bool:
        """True for a file this run writes in its folder (reports, summaries, nsys.log, its lock, a rank's
        report): no other output (``--history``) may be one of them."""
        from nvtx_trace.files import LOCK_NAME, same_file, same_path

        path = Path(path)
        if not (same_file(path.parent, self.out_dir) or same_path(path.parent, self.out_dir)):
            return False
        return path.name in (*OUTPUT_NAMES, *REPORT_OUTPUTS, LOG_NAME, LOCK_NAME) or (
            torchrun.rank_of(path) is not None and path.name.endswith((".nsys-rep", ".qdstrm", ".sqlite")))

    @property
    def log(self) -> Path:
        """nsys's own output (nsys.log): shown only when a step fails."""
        return self.out_dir / LOG_NAME

    def nsys_command(self) -> list[str]:
        """The command line ``execute`` runs (the program started through ``own_output``)."""
        return profile_command(self.nsys, self.stem, self.trace, self.extra, self.argv,
                               own_output_python=sys.executable, launcher=self.launcher)


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
    # at most STEM_MAX characters: the folder adds a time stamp (and tune "-tune"), and a name past the file-name
    # limit (255 bytes) failed run, try and tune with a traceback
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:STEM_MAX].rstrip("._") or "run"


STEM_MAX = 100


def output_dir(opts: RunOptions, mode: str, now: float | None = None) -> Path:
    """``--out`` as given (refused when it already holds outputs, unless --force), or a fresh folder."""
    if opts.out is not None:
        out = given_folder(Path(opts.out))
        check_unclaimed(out)
        names = dict.fromkeys((*OUTPUT_NAMES, *REPORT_OUTPUTS, LOG_NAME))  # what --force would replace
        taken = [n for n in names if (out / n).exists()] + rank_outputs(out)[:3]
        if taken and not opts.force:
            raise UsageError(f"{out} already holds {', '.join(taken)}; choose another --out or pass --force")
        return out.resolve()
    return fresh_folder(Path(opts.out_root), run_name(opts.target, mode), now)


def given_folder(out: Path) -> Path:
    """An ``--out`` folder that can be written (it may not exist yet); UsageError (one line) otherwise."""
    problem = describe_unreadable(out)
    if problem:
        raise UsageError(f"--out {out} {problem}; give a folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    check_folder_writable(out)
    return out


def fresh_folder(root: Path, stem: str, now: float | None = None) -> Path:
    """``root/<stem>-<time>``, or ``-2``, ``-3``... after it when that exists; checked writable, not made."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = root / f"{stem}-{stamp}"
    check_folder_writable(base)
    out, n = base, 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out.resolve()


def rank_outputs(out: Path) -> list[str]:
    """The per-rank files of an earlier --per-rank run in ``out`` (rank0.nsys-rep, rank0.sqlite, ...)."""
    if not out.is_dir():
        return []
    return sorted(p.name for p in out.iterdir() if torchrun.rank_of(p) is not None
                  and p.name.endswith((".nsys-rep", ".qdstrm", ".sqlite")))


def _has_cuda_device() -> bool:
    """A cheap guess without importing torch: the NVIDIA driver's device node."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def _autotrace_env(opts: RunOptions) -> dict[str, str]:
    """--autotrace-depth/--autotrace-budget as the variables nvtx_autotrace reads, checked here first."""
    env = {}
    try:
        if opts.autotrace_depth is not None:
            depth = names.parse_module_depth(opts.autotrace_depth)
            env[names.autotrace_option_env("module_depth")] = "auto" if depth is None else str(depth)
        if opts.autotrace_budget is not None:
            env[names.autotrace_option_env("budget_pct")] = repr(names.parse_budget_pct(opts.autotrace_budget))
    except ValueError as exc:
        flag = "--autotrace-budget" if "percentage" in str(exc) else "--autotrace-depth"
        raise UsageError(f"{flag} {exc}") from None
    if env and not opts.autotrace:
        raise UsageError("--autotrace-depth/--autotrace-budget set nvtx_autotrace's ranges; drop --no-autotrace")
    return env


def _check_request(opts: RunOptions) -> AnalysisOptions:
    """Refuse options that contradict each other, before anything is probed; the analysis options, parsed."""
    if not opts.target:
        raise UsageError("nothing to run; example: nvtx-trace run train.py --epochs 1")
    if (opts.warmup_steps is None) != (opts.steps is None):
        raise UsageError("a capture window needs both --warmup-steps N and --steps M")
    if opts.steps is not None and (opts.steps < 1 or opts.warmup_steps < 0):
        raise UsageError("--steps must be >= 1 and --warmup-steps >= 0")
    if opts.capture_mode not in CAPTURE_MODES:
        raise UsageError(f"--capture-mode must be one of {', '.join(CAPTURE_MODES)}")
    analysis = parse_options(opts.min_gap_ms)
    if opts.full and opts.steps is not None:
        raise UsageError("--full profiles everything: drop --warmup-steps/--steps, or --full")
    if opts.steps is not None and not opts.autotrace:
        raise UsageError("--warmup-steps/--steps count steps with nvtx_autotrace; drop --no-autotrace")
    if opts.tried and not opts.autotrace:
        raise UsageError("--try's knobs are applied by nvtx_autotrace; drop --no-autotrace")
    return analysis


def _check_target(opts: RunOptions, mode: str) -> None:
    if mode == "script" and not Path(opts.target[0]).is_file():
        raise UsageError(f"{opts.target[0]}: no such script")
    if Path(opts.target[0]).is_dir():
        raise UsageError(f"{opts.target[0]} is a folder; give the script, e.g. {Path(opts.target[0]) / 'train.py'}")
    if mode == "command" and shutil.which(opts.target[0]) is None:
        raise UsageError(f"{opts.target[0]}: command not found")
    if opts.python and shutil.which(opts.python) is None and not Path(opts.python).is_file():
        raise UsageError(f"--python {opts.python}: not found")


def _check_python(opts: RunOptions, python: str, nsys: Nsys, notes: list[str], module: str | None = None) -> dict:
    """The target Python's facts; a long run that would record no range of ours is refused, with the fix, and so
    is a module (``-m``) that Python would not find."""
    probe = target_python.probe(python, module=module)
    if "error" in probe:
        raise UsageError(f"{python} does not run")
    if module and probe.get("module_found") is False:
        raise UsageError(no_module(module, python))
    problem = nvtx_problem(probe.get("nvtx"), nsys.version)
    if opts.autotrace and not probe.get("autotrace"):
        raise UsageError(f"nvtx_autotrace is not importable by {python}; pip install nvtx-trace there, "
                         "or pass --no-autotrace")
    install = f"{python} -m pip install 'nvtx==0.2.11'"
    if opts.autotrace and not probe.get("nvtx"):
        raise UsageError(f"the nvtx package is missing for {python}, so no range would be recorded; "
                         f"install it with: {install} (a version every nsys records), or pass --no-autotrace")
    if opts.autotrace and problem:
        raise UsageError(f"{problem}; install the one it records with: {install}, or pass --no-autotrace")
    if problem:
        notes.append(problem)
    return probe


def no_module(module: str, python: str) -> str:
    return (f"-m {module}: {python} finds no module of that name from {os.getcwd()}; check its spelling, or run "
            "from the folder its package is in")


def check_module(module: str, python: str | None) -> None:
    """``python -m module`` would fail: said before anything starts (a profile would run nothing)."""
    python = python or sys.executable
    if target_python.probe(python, module=module).get("module_found") is False:
        raise UsageError(no_module(module, python))


def _per_rank_launch(opts: RunOptions, mode: str) -> torchrun.Launch:
    """The torchrun command taken apart where nsys goes in; refused for anything else."""
    launch = torchrun.parse(opts.target) if mode == "command" else None
    if launch is None:
        raise UsageError("--per-rank puts one nsys per rank inside torchrun; give a torchrun command, e.g. "
                         "nvtx-trace run --per-rank -- torchrun --nproc-per-node 2 train.py")
    if not launch.program:
        raise UsageError(f"{' '.join(opts.target)}: torchrun is given nothing to run; put the script after its "
                         "options, e.g. torchrun --nproc-per-node 2 train.py")
    if launch.kind == "script" and not Path(launch.program[0]).is_file():
        raise UsageError(f"{launch.program[0]}: no such script")
    if launch.kind == "command" and shutil.which(launch.program[0]) is None:
        raise UsageError(f"{launch.program[0]}: command not found (torchrun --no-python runs it per rank)")
    return launch


def _program_argv(opts: RunOptions, mode: str, python: str) -> list[str]:
    """The program as nsys starts it: ``python -m nvtx_autotrace`` in front of a script or module."""
    autotrace = ["-m", "nvtx_autotrace"] if opts.autotrace else []
    if mode == "script":
        return [python, *autotrace, *opts.target]
    if mode == "module":
        return [python, *autotrace, "-m", *opts.target]
    return list(opts.target)


def _capture_window(opts: RunOptions, probe: dict, trace: list[str], extra: list[str],
                    env: dict[str, str]) -> tuple[str, Path | None]:
    """Options and variables that cut the capture at step boundaries: a fixed window (--steps) or the
    default one the program picks after warm-up; (what will be profiled in words, the default window's
    decisions file)."""
    if opts.steps is None and not default_window.applies(opts):
        return "the whole run", None
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
        extra += ["--capture-range=nvtx", "--nvtx-capture", names.NSYS_NVTX_CAPTURE, "--capture-range-end=stop"]
        env.setdefault("NSYS_NVTX_PROFILER_REGISTER_ONLY", "0")
        how = f"an NVTX range {names.NSYS_NVTX_CAPTURE}"
    if opts.steps is None:
        window_file, capture = default_window.arm(env, cmode, opts.keep_running)
        return capture, window_file
    last = opts.warmup_steps + opts.steps - 1
    env[CAPTURE_ENV] = f"{opts.warmup_steps}:{opts.steps}:{cmode}" + ("" if opts.keep_running else ":exit")
    window_file = default_window.decisions_file(env)  # how far the program got, if it never reaches the window
    return (f"steps {opts.warmup_steps}-{last} only (started/stopped at step boundaries with {how})"
            + ("" if opts.keep_running else "; the program is stopped after them (--keep-running: not)")), window_file


def plan_run(opts: RunOptions, nsys: Nsys | None = None, environ=None, now: float | None = None) -> Plan:
    """Check the request, find nsys, and build the command line, environment and output folder."""
    analysis = _check_request(opts)
    autotrace_env = _autotrace_env(opts)
    mode = classify(opts.target, opts.module)
    _check_target(opts, mode)
    nsys = nsys or find_nsys(opts.nsys)
    env = dict(os.environ if environ is None else environ)
    env.update(autotrace_env)
    env.pop(names.TRY_ENV, None)
    if opts.tried:
        env[names.TRY_ENV] = knobs.to_json(opts.tried)
    launch = _per_rank_launch(opts, mode) if opts.per_rank else None
    python = opts.python or (launch.python if launch else sys.executable)
    notes: list[str] = [n for n in [deep_tmp_note(env)] if n]
    probe = _check_python(opts, python, nsys, notes, opts.target[0] if mode == "module" else None)
    argv = launch.rank_argv(python, opts.autotrace) if launch else _program_argv(opts, mode, python)

    site_dir = None
    if mode == "command" and opts.autotrace and (launch is None or launch.kind == "command"):
        site_dir = INJECT_DIR  # a folder of the package: nothing to create, nothing to clean up
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir), env.get("PYTHONPATH")) if p)

    supported = supported_options(nsys)
    trace = list(opts.trace) if opts.trace else pick_traces(nsys, TRAINING_TRACES)
    if "nvtx" not in trace and opts.autotrace:
        notes.append("NVTX is not traced (-t without nvtx): the autotrace ranges will not be recorded")
    extra = list(QUIET_OPTIONS)
    if "--trace-fork-before-exec" in supported or not supported:
        extra += ["--trace-fork-before-exec=true"]  # DataLoader workers are forked without exec
    capture, window_file = _capture_window(opts, probe, trace, extra, env)
    extra += list(opts.nsys_args)

    if launch:
        capture += ", one report per rank (an nsys for each, inside torchrun)"
    out_dir = output_dir(opts, mode, now)
    return Plan(analysis=analysis, nsys=nsys, out_dir=out_dir, argv=argv, env=env,
                trace=trace, extra=extra, capture=capture,
                mode=mode, notes=notes, capture_window=None if opts.steps is None else (opts.warmup_steps, opts.steps),
                site_dir=site_dir, options=opts, window_file=window_file,
                launcher=[*launch.launcher, "--no-python"] if launch else [], ranks=launch.local_ranks if launch else None)
