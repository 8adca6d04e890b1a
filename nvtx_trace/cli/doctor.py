"""`nvtx-trace doctor`: what `run` needs on this machine, what was found, and what is missing.

Why: most failed captures are set-up problems (no nsys, an importer nsys cannot find, an
nvtx release this nsys does not record). Torch is inspected in a child interpreter, so
doctor stays fast to import and checks the Python that will actually run the program.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from nvtx_trace.analyzer.trace.reader import Reader
from nvtx_trace.capture import locate, target_python
from nvtx_trace.capture.export import export_sqlite
from nvtx_trace.capture.interrupts import Interrupted
from nvtx_trace.capture.profile import profile
from nvtx_trace.errors import NvtxTraceError
from nvtx_trace.report.sections import printable

OK, WARN, MISSING = "ok", "warn", "missing"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")

@dataclass
class Check:
    """One line of the doctor's report; ``required`` items block ``nvtx-trace run``."""

    name: str
    status: str  # OK, WARN or MISSING
    detail: str
    required: bool = True

    @property
    def blocking(self) -> bool:
        return self.required and self.status == MISSING


def probe_python(python: str, timeout: float = 180) -> dict:
    """Versions of nvtx/torch (and CUDA availability) as seen by ``python``: run's probe, importing torch
    in that child."""
    return target_python.probe(python, import_torch=True, timeout=timeout)


def check_nsys(explicit: Optional[str]) -> tuple[list[Check], Optional[locate.Nsys]]:
    try:
        found = locate.find_nsys(explicit)
    except NvtxTraceError as exc:
        return [Check("nsys", MISSING, str(exc))], None
    checks = [Check("nsys", OK, f"{found.version} at {found.path} (found via {found.found_via})"),
              _importer(found)]
    if checks[-1].status != MISSING:
        checks.append(_import_step(found))
    traces = locate.supported_traces(found)
    from nvtx_trace.runner.plan import TRAINING_TRACES

    wanted = locate.pick_traces(found, TRAINING_TRACES)  # what `run` traces, not everything nsys can
    checks.append(Check("traces", OK if {"nvtx", "cuda"} <= traces else WARN,
                        f"will trace {','.join(wanted)}" if traces else "could not read nsys profile --help",
                        required=False))
    checks.append(source_lines(locate.supported_options(found)))
    return checks, found


def source_lines(options: frozenset[str]) -> Check:
    """Whether implicit syncs (``data[mask]``, ``nonzero``: no wrapper sees them) can be given a Python line. nsys
    2025.3.1 offers --python-backtrace=cuda, yet on an H200 it attached no Python frame to any CUDA call, and
    --cudabacktrace records native frames only (``at::native::item``): measured for issue 43, so both stay off."""
    mine = "syncs and copies nvtx_autotrace wraps are named by line; implicit syncs by their innermost range"
    if "--python-backtrace" in options:
        return Check("source lines", OK, f"{mine} (this nsys offers --python-backtrace=cuda, but nsys 2025.3.1 "
                     "recorded no Python line for a CUDA call with it, so it stays off)", required=False)
    return Check("source lines", OK, f"{mine} (this nsys records no Python backtraces)", required=False)


def _importer(found: locate.Nsys) -> Check:
    if found.importer is None or found.importer_version is None:
        hint = "; install libdw1 and libelf1 (or put them on LD_LIBRARY_PATH)" if "libdw" in str(
            found.importer_problem) else ""
        return Check("importer", MISSING, f"{found.importer_problem}{hint}; captures would stay .qdstrm")
    if found.importer_problem:
        return Check("importer", WARN, found.importer_problem)
    return Check("importer", OK, f"{found.importer_version} at {found.importer}")


def _import_step(found: locate.Nsys) -> Check:
    """nsys looks for its importer only inside its own install; say who will run it."""
    if found.imports_itself:
        return Check("import step", OK, "nsys imports captures itself", required=False)
    return Check("import step", OK, "nsys cannot find its importer (split layout, e.g. Debian's package) and "
                 "prints 'Importer error status'; nvtx-trace runs the importer itself", required=False)


def check_python(python: str, found: Optional[locate.Nsys]) -> list[Check]:
    info = probe_python(python)
    if "error" in info:
        return [Check("python", MISSING, f"{python} does not run: {info['error']}")]
    checks = [Check("python", OK, f"{info['python']} at {python}", required=False)]
    torch = info.get("torch")
    if not torch:
        checks.append(Check("torch", MISSING, f"not installed for {python}; install the build for your CUDA "
                                              "(https://pytorch.org/get-started/locally/)"))
    elif "torch_error" in info:
        checks.append(Check("torch", MISSING, f"{torch} installed but import fails: {info['torch_error']}"))
    else:
        cuda = (f"CUDA {info.get('cuda_version')} available, {info.get('gpus')} GPU(s)" if info.get("cuda")
                else "CUDA not available: only CPU-side ranges will be captured")
        checks.append(Check("torch", OK, torch, required=False))
        checks.append(Check("cuda", OK if info.get("cuda") else WARN, cuda, required=False))
    nvtx = info.get("nvtx")
    problem = locate.nvtx_problem(nvtx, found.version) if (nvtx and found) else None
    if not nvtx:
        checks.append(Check("nvtx", MISSING, f"not installed for {python}; {python} -m pip install 'nvtx==0.2.11' "
                                             "(the version every nsys records)"))
    elif problem:
        checks.append(Check("nvtx", MISSING, problem))
    else:
        checks.append(Check("nvtx", OK, nvtx + (f", recorded by nsys {found.version}" if found else "")))
    return checks


def check_tmpdir() -> Check:
    """The program's TMPDIR leaves its DataLoader workers room for their sockets (files.deep_tmp_note)."""
    import os

    from nvtx_trace.files import deep_tmp_note, socket_room

    note = deep_tmp_note(os.environ)
    if note:
        return Check("temporary folder", WARN, note, required=False)
    tmp = tempfile.gettempdir()
    return Check("temporary folder", OK, f"{tmp} ({socket_room(tmp)} bytes to spare for DataLoader workers' "
                 "sockets)", required=False)


def check_browser() -> Check:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return Check("chromium", OK, f"{path} (HTML report tests)", required=False)
    return Check("chromium", WARN, "not found; only needed to test HTML reports in a browser", required=False)


def probe_capture(found: locate.Nsys, python: str) -> Check:
    """A real tiny capture: profile one NVTX range, import, export, read it back."""
    import sqlite3

    with tempfile.TemporaryDirectory(prefix="nvtx-trace-doctor-") as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text("import nvtx\nwith nvtx.annotate('nvtx_trace_doctor'):\n    pass\n")
        try:
            result = profile(found, [python, str(script)], Path(tmp) / "probe",
                                      trace=locate.pick_traces(found, ["nvtx"]),
                                      extra=["--sample=none", "--cpuctxsw=none"], capture_output=True)
            if result.interrupted:  # nsys was told, and stopped the probe: so do we
                raise Interrupted(result.signal)
            db = export_sqlite(found, result.require_report())
            reader = Reader(db)
            try:
                hits = reader.count_ranges_named("nvtx_trace_doctor")
            finally:
                reader.close()
        except (NvtxTraceError, sqlite3.Error) as exc:
            return Check("test capture", MISSING, f"failed: {exc}")
    how = " (imported by nvtx-trace)" if result.imported_by_us else ""
    if not hits:
        return Check("test capture", MISSING, "the report holds no NVTX range: nsys does not record this nvtx")
    return Check("test capture", OK, f"NVTX range recorded, report imported and exported{how}")


def gather(nsys: Optional[str] = None, python: Optional[str] = None, probe: bool = False) -> list[Check]:
    """Every check, in display order."""
    python = python or sys.executable
    checks, found = check_nsys(nsys)
    checks += check_python(python, found)
    checks.append(check_tmpdir())
    checks.append(check_browser())
    if probe and found is not None:
        checks.append(probe_capture(found, python))
    return checks


def render(checks: list[Check]) -> list[str]:
    marks = {OK: "ok", WARN: "warn", MISSING: "MISSING"}
    width = max(len(c.name) for c in checks)
    return [f"{marks[c.status]:>7}  {c.name:<{width}}  {printable(c.detail)}" for c in checks]  # $NSYS as given


def doctor(
    nsys: Optional[str] = typer.Option(None, "--nsys", help="nsys binary or install directory to check."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter that will run your program "
                                         "(default: this one)."),
    probe: bool = typer.Option(False, "--probe", help="Also run a real tiny capture (a few seconds)."),
) -> None:
    """Check that nsys, its importer, torch and nvtx are ready for `nvtx-trace run`.

    Exits with status 1 when something `run` needs is missing.

    Example: nvtx-trace doctor --probe
    """
    checks = gather(nsys, python, probe)
    for line in render(checks):
        typer.echo(line)
    blocking = [c.name for c in checks if c.blocking]
    if blocking:
        typer.echo(f"nvtx-trace run cannot work yet: fix {', '.join(blocking)}", err=True)
        raise typer.Exit(1)
    typer.echo("Ready for nvtx-trace run.")
