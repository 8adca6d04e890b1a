"""Read many reports at once: a local process pool by default, a Dask cluster when one is named.

Each worker reads one report at a time and returns only its decoded tables (decoded.py), so a
worker's memory is bounded by the largest report, whatever the number of ranks; the merged
analysis then runs in this process. Dask is imported only when ``--scheduler`` asks for it.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from nvtx_trace.analyzer.trace.decoded import DecodedReport
from nvtx_trace.errors import UsageError

# Imported once in the fork server, so each worker starts with them loaded.
PRELOAD = ["nvtx_trace.analyzer.analysis", "pandas", "numpy"]


def read_reports(paths: list[Path], decode: Callable[[Path], DecodedReport], scheduler: str | None = None,
                 workers: int | None = None) -> list[DecodedReport]:
    """Every report decoded by ``decode`` (the framework's, a module-level function a worker can import), in the
    order given (options checked by analyzer.options). ``workers=1`` reads them one by one in this process."""
    if scheduler is not None:
        return _with_dask(paths, decode, scheduler)
    n = min(len(paths), workers or os.cpu_count() or 1)
    if n <= 1:
        return [decode(p) for p in paths]
    ctx = multiprocessing.get_context(_start_method())
    method = ctx.get_start_method()
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, max_tasks_per_child=None,
                             initializer=_signals_to_the_parent) as pool:
        return list(pool.map(decode, paths))


def _signals_to_the_parent() -> None:
    """A worker leaves signals to this process, which ends the pool when told to stop: a forked worker would
    otherwise run the parent's handler (and a terminal's Ctrl-C, sent to every worker, print tracebacks)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _start_method() -> str:
    """A fork server (no threads of this process are copied), unless the main program has no file to
    start workers from (``python -`` or ``-c``), where only a plain fork works."""
    methods = multiprocessing.get_all_start_methods()
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main is not None and not Path(main).is_file() and "fork" in methods:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _with_dask(paths: list[Path], decode: Callable[[Path], DecodedReport], scheduler: str) -> list[DecodedReport]:
    """On a Dask cluster: an address (its workers must see the same files), or ``local:N`` processes here."""
    from distributed import Client, LocalCluster

    cluster = None
    if scheduler.startswith("local:"):
        cluster = LocalCluster(n_workers=int(scheduler.split(":", 1)[1]), threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout=30)
        except OSError as exc:
            raise UsageError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc}); "
                             "check the address, or use local:N") from None
    try:
        futures = client.map(decode, [str(Path(p).resolve()) for p in paths], pure=False)
        reports = client.gather(futures)
        for report, path in zip(reports, paths):  # the paths as the user gave them, not as the workers saw them
            report.path = report.info.path = Path(path)
        return reports
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
