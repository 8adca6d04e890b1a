"""Shared fixtures. Prerequisites (nsys, torch, chromium) skip with a reason when absent,
except under CI=true, where a missing prerequisite fails the test: CI must run them for real."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_reports"
IN_CI = os.environ.get("CI", "").lower() == "true"
# nsys 2022.4 now and then never finishes after a short program (nvtx_trace/capture/stuck.py): under test, give up
# on it after a minute with nothing written, not five, so such a test fails in time instead of at its timeout
os.environ.setdefault("NVTX_TRACE_NSYS_STALL_S", "60")


def knob_records(*lines: str) -> list[dict]:
    """A run's knob records as nvtx_autotrace writes them to the window file, from their lines
    ("tf32=1: set at start-up"; "compile=1: not applied to GPT: ..." is a knob that did not apply)."""
    from nvtx_trace import knobs

    out = []
    for line in lines:
        head, _, said = line.partition(": ")
        out.append({"event": "knob", "knobs": knobs.parse(head), "applied": not said.startswith("not applied"),
                    "line": line})
    return out


def again_after_nsys_fault(make, clear: Path | None = None):
    """``make()`` (a capture: a ProfileResult or a finished ``nvtx-trace run``), made once more after one of nsys
    2022.4's own faults, which the tool names as nsys's: a hang after the program (nvtx_trace/capture/stuck.py:
    the tool ended it) or a start-up that fails before the program runs ("Local Endpoint is not available",
    seen on this VM under load). ``clear`` (the run's folder) is removed first. A capture that several tests
    share is not lost to those; any other fault still fails at once."""
    result = make()
    said = (getattr(result, "stderr", "") or "") + (getattr(result, "log", "") or "")
    nsys_fault = (getattr(result, "stuck", False) or "made no progress for" in said
                  or "nsys failed before it started the program" in said
                  or (getattr(result, "rep", True) is None and "Local Endpoint is not available" in said))
    if not nsys_fault:
        return result
    if clear is not None:
        shutil.rmtree(clear, ignore_errors=True)
    return make()


def unpack_samples(folder: Path = SAMPLES) -> None:
    """The shipped samples are xz-compressed beside the two the README uses (the tree a device call carries stays
    small): unpack each once, atomically, before any test module globs sample_reports/*.sqlite."""
    import lzma

    for packed in sorted(folder.glob("*.sqlite.xz")):
        target = packed.with_suffix("")
        if target.exists() and target.stat().st_mtime >= packed.stat().st_mtime:
            continue
        part = target.with_name(target.name + ".part")
        with lzma.open(packed) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst)
        part.replace(target)


unpack_samples()


def edited_copy(source: Path, path: Path, *statements: str) -> Path:
    """A copy of a report at ``path`` with SQL ``statements`` applied to it (the edge cases of a real export)."""
    import sqlite3

    shutil.copyfile(source, path)
    conn = sqlite3.connect(path)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    return path


def need(what: str, present: bool) -> None:
    """Skip (or fail under CI=true) when a prerequisite is missing."""
    if present:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is missing; .ci/run must install it")
    pytest.skip(f"{what} is not installed")


def installed_nsys():
    """The nsys nvtx-trace would use (nvtx_trace.capture.locate.find_nsys); skip, or fail under CI, without one."""
    from nvtx_trace.capture import locate
    from nvtx_trace.errors import NsysNotFoundError

    try:
        return locate.find_nsys()
    except NsysNotFoundError:
        need("Nsight Systems (nsys)", False)


_SAMPLE_ANALYSES: dict = {}


def sample_analysis(path):
    """``analyze`` of a shipped sample report with default options, run once per session (each takes ~0.5 s and
    many tests read the same ones); every caller gets its own deep copy to change as it likes. Tests that
    patch the analyzer call ``analyze`` themselves."""
    import copy

    from nvtx_trace.analyzer import analyze

    path = Path(path).resolve()
    assert path.parent == SAMPLES.resolve(), f"{path}: only shipped samples are shared"
    if path not in _SAMPLE_ANALYSES:
        _SAMPLE_ANALYSES[path] = analyze(path)
    return copy.deepcopy(_SAMPLE_ANALYSES[path])


@pytest.fixture(scope="session", autouse=True)
def private_history(tmp_path_factory):
    """No test touches the user's run history: every run (and its subprocesses) records into a temporary one."""
    old = os.environ.get("NVTX_TRACE_HISTORY")
    path = tmp_path_factory.mktemp("history") / "history.db"
    os.environ["NVTX_TRACE_HISTORY"] = str(path)
    yield path
    if old is None:
        os.environ.pop("NVTX_TRACE_HISTORY", None)
    else:
        os.environ["NVTX_TRACE_HISTORY"] = old


@pytest.fixture
def nsys_path() -> str:
    path = os.environ.get("NSYS") or shutil.which("nsys")
    need("Nsight Systems (nsys)", bool(path))
    return path


@pytest.fixture
def torch_module():
    need("PyTorch", importlib.util.find_spec("torch") is not None)
    import torch

    return torch


@pytest.fixture(scope="module")
def torch():
    """torch on one thread, with nvtx importable (the autotrace tests)."""
    need("PyTorch", importlib.util.find_spec("torch") is not None)
    need("nvtx", importlib.util.find_spec("nvtx") is not None)
    import torch

    torch.set_num_threads(1)
    return torch


@pytest.fixture
def at(torch):
    """nvtx_autotrace, uninstalled, with a Recorder ready (``at.recorder``); uninstalled again afterwards."""
    import nvtx_autotrace
    from nvtx_autotrace import _backend, _registry

    nvtx_autotrace.uninstall()
    _registry._warned.clear()  # each test sees its own once-per-process warnings
    rec = _backend.Recorder()
    nvtx_autotrace.use_backend(rec)
    nvtx_autotrace.recorder = rec
    yield nvtx_autotrace
    nvtx_autotrace.uninstall()
    nvtx_autotrace.use_backend(None)


@pytest.fixture
def sample(request):
    """Path of a shipped sample report, by file name."""

    def _get(name: str) -> Path:
        path = SAMPLES / name
        assert path.exists(), f"missing sample report {path}"
        return path

    return _get


def ctrl_c_when(child: subprocess.Popen, marker: str, timeout: float) -> tuple[str, str]:
    """Wait until the child's stderr shows a line starting with ``marker``, then press Ctrl-C the way
    a terminal does (SIGINT to its process group); returns (stdout, stderr seen so far + the rest).

    The child must run in its own session (``start_new_session=True``) with text pipes."""
    seen = []
    try:
        for line in child.stderr:
            seen.append(line)
            if line.startswith(marker):
                break
        else:
            pytest.fail(f"the program never printed {marker!r}: " + "".join(seen[-20:]))
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=timeout)
    finally:
        end_tree(child)
    return out, "".join(seen) + err


def end_tree(child: subprocess.Popen) -> None:
    """After a failed test: the tool and everything it started (nsys, the program, its workers, in groups and
    sessions of their own) are killed, so that no spinning capture slows the tests that follow."""
    from nvtx_trace.capture import processes

    if child.poll() is not None:
        return
    for pid in [*processes.descendants(child.pid), child.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    child.wait()


SMALL_DISK = 64 << 20


@pytest.fixture
def tmpfs(tmp_path):
    """tmpfs(size, read_only=False) -> a fresh tmpfs folder: a real full disk or read-only mount for the write-
    failure tests (mounting needs root: skipped without it), unmounted after the test."""
    mounted = []

    def make(size: str = "64k", read_only: bool = False) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}): needs root")
        mounted.append(where)
        if not os.path.ismount(where) or shutil.disk_usage(where).total > SMALL_DISK:
            # a container may answer `mount` with success and mount nothing: filling that folder would fill the host
            pytest.skip(f"mount reported success but {where} is not a small tmpfs here")
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill the file system of ``folder`` (a small tmpfs) until at most ``leave`` bytes remain, in ``filler``."""
    if shutil.disk_usage(folder).total > SMALL_DISK:
        raise AssertionError(f"refusing to fill {folder}: not a small tmpfs")
    with open(folder / "filler", "wb", buffering=0) as fh:
        try:
            while shutil.disk_usage(folder).free > leave:
                fh.write(b"\0" * 4096)
        except OSError:
            pass


# ---------------------------------------------------------------- nothing left behind (issue 42)
# Every process the suite starts, and the tool run in this one, writes its temporary files to a TMPDIR of the
# suite's own and carries SUITE_MARK; at the end, what is left in that TMPDIR is listed with the test it appeared
# during, and of the real temporary folder only what nsys writes there whatever TMPDIR says (NSYS_IN_TMP): the
# rest of it belongs to other programs on the machine, never the suite's to judge (issue 54). A process still
# carrying the mark, or a file of the tool's or its nsys's (THE_TOOLS), fails the run.
SUITE_MARK = "NVTX_TRACE_TEST_SUITE"
REAL_TMP = Path(tempfile.gettempdir())
SUITE_TMP = REAL_TMP / f"nvtx-trace-suite-{os.getpid()}"
_TMP_BEFORE: set[str] = set()


def _isolate_tmp() -> None:
    """From pytest_configure: a pytest session only (a script importing this module, `tests/test_sections.py
    --update`, makes no folder), removed at exit even when the session never finishes (a usage error)."""
    import atexit

    _TMP_BEFORE.update(p.name for p in REAL_TMP.iterdir())
    SUITE_TMP.mkdir(exist_ok=True)
    atexit.register(shutil.rmtree, SUITE_TMP, ignore_errors=True)
    os.environ[SUITE_MARK] = str(os.getpid())
    os.environ["TMPDIR"] = str(SUITE_TMP)  # for the processes tests start
    import multiprocessing.util

    multiprocessing.util.get_temp_dir()  # this process's pymp-* stays in REAL_TMP: removed as it exits, after SUITE_TMP
    # tmp_path stays where pytest always puts it (/tmp/pytest-of-USER): under SUITE_TMP a test's TMPDIR of
    # tmp_path/"tmp" grew past what a program's multiprocessing sockets fit (pymp-*/listener-*, 107 bytes), and
    # DataLoader workers dropped every batch: the SIGKILL tests hung under nsys (stop 59's CI)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(REAL_TMP))
    tempfile.tempdir = str(SUITE_TMP)  # the tool run in this process writes there too; REAL_TMP is cached above
    _watch_others_configs()


# Caches their owners keep on purpose: torch's compile cache, nsys's lock folder, Dask's scratch space.
KEPT_ON_PURPOSE = ("torchinductor_", "nvidia", "dask-scratch-space")
# What nvtx-trace and the nsys it drives make and must remove: one left is a defect of the tool, and fails the run.
THE_TOOLS = ("nvtx-trace-", "injection_config_", "nsys_termination_status_", "nsys-report-")
NSYS_IN_TMP = ("injection_config_", "nsys_termination_status_")  # written to /tmp whatever TMPDIR says
_SEEN_IN_TMP: dict[str, str] = {}  # what appeared in SUITE_TMP -> the test it appeared during


_OTHERS_CONFIGS: set[str] = set()  # injection configs only processes of no test named: another nsys's
_OTHERS_PIDS: set[str] = set()  # another nsys's processes (its own, its program's): their termination status files


def _watch_others_configs() -> None:
    """Twice a second, the nsys injection configs that processes without this suite's mark name, and those
    processes and any nsys without the mark: another user's nsys beside the suite leaves its configs and its
    `nsys_termination_status_PID` in /tmp when it is killed, and they are not the suite's to judge."""
    import threading

    mark = f"{SUITE_MARK}={os.getpid()}".encode()
    ours: set[str] = set()
    our_pids: set[str] = set()

    def look() -> None:
        import time

        from nvtx_trace.capture.nsys_files import configs_in, environ_of
        from nvtx_trace.capture.processes import name_of, of_nsys

        while True:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                env = environ_of(pid)
                named = configs_in(env)
                if named:
                    (ours if mark in env else _OTHERS_CONFIGS).update(named)
                if mark in env:
                    our_pids.add(pid)
                elif env and (named or of_nsys(name_of(int(pid)))):
                    _OTHERS_PIDS.add(pid)
            _OTHERS_CONFIGS.difference_update(ours)  # one a test's process named too is judged
            _OTHERS_PIDS.difference_update(our_pids)  # a pid a test's process had too (reused): judged
            time.sleep(0.5)

    threading.Thread(target=look, daemon=True, name="others-nsys-configs").start()


def new_nsys_configs(before: set) -> set:
    """nsys's injection configs in /tmp made since ``before`` that no live process names: the ones a test's nsys
    left behind (another nsys on the machine names its own while it runs, and removes it as it ends; one killed
    leaves it, named by processes of no test: _watch_others_configs)."""
    import time

    from nvtx_trace.capture.nsys_files import in_use

    deadline = time.monotonic() + 5  # another nsys ending just now removes its own in a moment
    while True:
        left = {p for p in set(Path("/tmp").glob("injection_config_*")) - before
                if p.exists() and str(p) not in in_use() and str(p) not in _OTHERS_CONFIGS}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def carries_mark(pid) -> bool:
    """Whether a process was started by this suite (its environment holds the mark; nsys's agents inherit it)."""
    from nvtx_trace.capture.nsys_files import environ_of

    return f"{SUITE_MARK}={os.getpid()}".encode() in environ_of(pid)


def marked_processes() -> list[str]:
    """Live processes (zombies aside) that carry this suite's mark: this one and the helpers multiprocessing
    keeps for it (a forkserver, a resource tracker, which end with it) excepted."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid() or not carries_mark(pid):
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state, parent = fh.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                args = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if state == "Z" or (int(parent) == os.getpid() and "from multiprocessing." in args):
            continue
        found.append(f"{pid} {args[:200]}")
    return found


@pytest.fixture(autouse=True)
def _what_each_test_leaves(request):
    """Notes which test each leftover in the suite's TMPDIR appeared during, for the list at the end."""
    yield
    for folder in (SUITE_TMP, REAL_TMP):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            _SEEN_IN_TMP.setdefault(name, request.node.nodeid)


def left_behind() -> list[str]:
    """What the suite's processes and temporary files left: empty when the suite cleaned up after itself."""
    import time

    deadline = time.monotonic() + 20  # a killed tree takes a moment to go
    while (procs := marked_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    files = sorted(p.name for p in SUITE_TMP.iterdir() if not p.name.startswith((*KEPT_ON_PURPOSE, "pytest-of-"))) \
        if SUITE_TMP.exists() else []
    from nvtx_trace.capture.nsys_files import in_use, termination_status_pid

    named = in_use()  # another nsys on the machine, still running, names its own injection configs: not ours
    new = sorted(name for name in {p.name for p in REAL_TMP.iterdir()} - _TMP_BEFORE
                 if name.startswith(NSYS_IN_TMP) and str(REAL_TMP / name) not in named | _OTHERS_CONFIGS
                 and termination_status_pid(name) not in _OTHERS_PIDS)
    return ([f"process still running: {p}" for p in procs]
            + [f"left in TMPDIR: {f} (by {_SEEN_IN_TMP.get(f, 'the session')})" for f in files]
            + [f"left in {REAL_TMP}: {n} (by {_SEEN_IN_TMP.get(n, 'the session')})" for n in new])


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(session.config.option, "collectonly", False):
        shutil.rmtree(SUITE_TMP, ignore_errors=True)
        return
    left = left_behind()
    # the default output folder is made in the folder a command runs in: in the system temp folder it is a user's
    # command run there (every test runs in its own folder), not a temporary file the tool failed to remove
    failing = [line for line in left if line.startswith("process still running") or
               (line.split(": ", 1)[1].startswith(THE_TOOLS) and not line.split(": ", 1)[1].startswith(
                   "nvtx-trace-out "))]
    for line in marked_processes():
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(SUITE_TMP, ignore_errors=True)
    if left:
        # The rest is the programs' own, left where a test killed them as a scheduler would (multiprocessing's
        # pymp-*, torchrun's torchelastic_*), or the browser's under load: listed, not failed.
        lines = "\n".join(f"  {'FAIL ' if line in failing else ''}{line}" for line in left)
        message = (f"\nthe suite left {len(left)} thing(s) behind, {len(failing)} of them the tool's or a process "
                   f"(tests/conftest.py, left_behind):\n{lines}\n")
        if _terminal_fd:
            os.write(_terminal_fd[0], message.encode())
        if failing:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------- markers, so that a unit loop needs no name lists
# (README, "Development": python -m pytest -q -m "not slow" runs in under 2 minutes on 2 cores, with or without torch)
NSYS_MODULES = {"test_run", "test_run_faults", "test_run_output", "test_autotrace_nsys", "test_nsys", "test_doctor",
                "test_history_run", "test_default_window", "test_run_per_rank", "test_loader_behind_run",
                "test_run_signals"}
TORCH_MODULES = {"test_autotrace", "test_autotrace_budget", "test_autotrace_nsys", "test_run", "test_run_faults",
                 "test_gpu_autotrace_samples", "test_history_run", "test_default_window", "test_run_per_rank",
                 "test_loader_behind_run"}
SLOW_MODULES = NSYS_MODULES | {  # each spawns CLI or training processes, or trains, per test
    "test_bad_input", "test_autotrace", "test_autotrace_budget", "test_gpu_autotrace_samples", "test_redact",
    "test_json_and_imports", "test_hostile_outputs", "test_history_schema", "test_hostile_invocations"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in NSYS_MODULES:
            item.add_marker(pytest.mark.nsys)
        if module in TORCH_MODULES:
            item.add_marker(pytest.mark.torch)
        if "chromium" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
        if module in SLOW_MODULES or "chromium" in getattr(item, "fixturenames", ()) \
                or item.name.startswith("test_cli_") or "million" in item.name:
            item.add_marker(pytest.mark.slow)


def pytest_runtest_setup(item):
    """A test marked torch (by its module, or by hand) skips without PyTorch, as one taking the torch fixture does:
    the unit loop runs with or without torch installed."""
    if item.get_closest_marker("torch") is not None:
        need("PyTorch", importlib.util.find_spec("torch") is not None)


# ---------------------------------------------------------------- a hang no timeout can end
# pytest-timeout's signal ends a test only when Python code runs again; a test stuck in C++ holding the GIL (a
# c10d store's destructor, say) would hold CI for its whole 90 minutes with no word. Past the test's limit plus
# HANG_GRACE_S, every thread's stack goes to the terminal and the run ends: a failure that says where it hung.
HANG_GRACE_S = float(os.environ.get("NVTX_TRACE_TEST_HANG_GRACE_S", "120"))
_terminal_fd: list[int] = []


def _sigint_as_in_a_terminal():
    """A suite started in the background of a script (``suite_under_load.sh``, ``cmd &`` without job control)
    inherits SIGINT ignored, and so would every program a test starts: its Ctrl-C would never become a
    KeyboardInterrupt (the Ctrl-C traceback test spun for 120 s in two loaded passes). A handler is reset to
    the default at exec, so the programs get SIGINT as they would from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config):
    _isolate_tmp()
    _sigint_as_in_a_terminal()
    # between conftest loading and the first test nothing is captured: fd 1 is still the terminal (or CI's log)
    try:
        _terminal_fd.append(os.dup(1))
    except OSError:
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import faulthandler

    marker = item.get_closest_marker("timeout")
    try:
        limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    except (ValueError, TypeError):
        limit = 0.0
    armed = limit > 0 and bool(_terminal_fd)
    if armed:
        faulthandler.dump_traceback_later(limit + HANG_GRACE_S, exit=True, file=_terminal_fd[0])
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()
