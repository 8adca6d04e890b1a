"""Batch waits in the training process and batch fetches inside DataLoader workers.

A loader is labelled by its creation site (``train.py:41``: the first frame that
is not the DataLoader's own ``__init__`` chain, so subclasses are seen through)
or by a ``nvtx_name`` attribute the user set on it. The label reaches the workers
through a picklable ``worker_init_fn`` wrapper, which works for ``fork`` (the
patches are inherited) and ``spawn`` (unpickling it imports nvtx_autotrace in the
fresh worker, which installs itself) alike, and for ``persistent_workers``.
"""

from __future__ import annotations

import os
import sys
import time

from nvtx_autotrace import _backend, _registry, steps
from nvtx_trace import names

SITE_ATTR = "_nvtx_autotrace_site"
LABEL_ATTR = "_nvtx_autotrace_label"
_worker: tuple[str, int] | None = None  # (loader label, worker id) inside a worker process


def creation_site(loader) -> str:
    """``file:line`` of the code that created ``loader`` (outside any of its own __init__s)."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_locals.get("self") is loader
                                 or frame.f_code.co_filename in (__file__, _registry.__file__)):
        frame = frame.f_back
    if frame is None:
        return type(loader).__name__
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def label_of(loader) -> str:
    name = getattr(loader, "nvtx_name", None)
    if name:
        return str(name)
    site = loader.__dict__.get(SITE_ATTR)
    return site or type(getattr(loader, "dataset", loader)).__name__


class WorkerInit:
    """Replaces a loader's ``worker_init_fn`` while its iterator starts workers; picklable."""

    def __init__(self, label: str, options: dict, user_fn):
        self.label, self.options, self.user_fn = label, options, user_fn

    def __call__(self, worker_id: int):
        global _worker
        import nvtx_autotrace

        # forked: already installed alike (no-op); spawned: importing installed from the
        # environment, which may differ from what the parent's install(**options) asked for
        nvtx_autotrace.install(**self.options)
        _worker = (self.label, worker_id)
        steps.configure(active=False, emit=False)  # steps belong to the training process
        if _backend.injection_present():
            _let_the_profiler_drain_at_exit()
        if self.user_fn is not None:
            return self.user_fn(worker_id)
        return None


# Workers end with os._exit, which skips the exit hooks where a profiler's injection would flush its
# buffer: under nsys 2022.4 a worker's last fetch range was lost in 3 of 9 runs with no pause, 1 of 6
# with 20 ms, 0 of 5 with 100 ms, 0 of 8 with 200 ms (programs/cpu_train.py, 2 workers). Only when a
# profiler is attached; it delays the end of each epoch by that much.
WORKER_EXIT_PAUSE_S = 0.2


def _let_the_profiler_drain_at_exit() -> None:
    import multiprocessing.util
    import time

    multiprocessing.util.Finalize(None, time.sleep, args=(WORKER_EXIT_PAUSE_S,), exitpriority=100)


_SCHEDSTAT = "/proc/thread-self/schedstat"


def _schedstat_ns() -> int:
    with open(_SCHEDSTAT, "rb") as fh:
        on_cpu, queued = fh.read().split()[:2]
    return int(on_cpu) + int(queued)


def _thread_time_ns() -> int:
    return time.thread_time_ns()


def _pick_demand():
    """The CPU a load asks for: time on a CPU plus time waiting in the run queue (Linux schedstat), so a worker
    slowed by a busy machine counts as busy, and only one waiting on storage or the network counts as waiting;
    where schedstat is missing, CPU time alone."""
    try:
        _schedstat_ns()
        return _schedstat_ns
    except (OSError, ValueError):
        return _thread_time_ns


_demand_ns = _pick_demand()


def _other_threads_ns() -> int:
    """CPU time of the process's other threads. In the main process torch's intra-op threads share a fetch's
    tensor work (8 of them: a timm ConvNeXt's crop-and-normalize fetch took 19 ms of the main thread's time); a
    worker runs with one thread and does all of it alone, so a worker count sized by the main thread's time
    alone came out 1 where it needed several (H200, 8 CPUs allowed: 73.4 -> 76.6 ms with that one worker)."""
    return time.process_time_ns() - time.thread_time_ns()


def install(options_for_workers: dict) -> None:
    from torch.utils.data import dataloader as dl
    from torch.utils.data._utils import fetch

    def make_init(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            try:
                self.__dict__[SITE_ATTR] = creation_site(self)
            except Exception:  # never let naming break a loader
                pass

        return __init__

    def make_get_iterator(original):
        def _get_iterator(self):
            label = label_of(self)
            if self.num_workers > 0:
                user_fn = self.worker_init_fn
                self.worker_init_fn = WorkerInit(label, options_for_workers, user_fn)
                try:
                    it = original(self)
                finally:
                    self.worker_init_fn = user_fn
            else:
                it = original(self)
            try:
                setattr(it, LABEL_ATTR, label)
            except Exception:
                pass
            return it

        return _get_iterator

    def make_next(original):
        def __next__(self):
            steps.touch()
            label = getattr(self, LABEL_ATTR, None)
            if label is None:
                label = type(getattr(self, "_dataset", self)).__name__
            _backend.push(names.loader_wait(label))
            try:
                return original(self)
            finally:
                _backend.pop()

        return __next__

    def make_fetch(original):
        def fetch(self, possibly_batched_index):
            where = _worker
            if where is None:  # the main process (num_workers=0): the batch wait covers it; its CPU time sizes
                cpu, pool = _demand_ns(), _other_threads_ns()  # the workers that would take it over
                try:
                    return original(self, possibly_batched_index)
                finally:
                    spent = _demand_ns() - cpu + max(0, _other_threads_ns() - pool)
                    _backend.push(names.worker_cpu(spent))
                    _backend.pop()
            _backend.push(names.worker_fetch(*where))
            cpu = _demand_ns()
            try:
                return original(self, possibly_batched_index)
            finally:
                _backend.push(names.worker_cpu(_demand_ns() - cpu))  # a worker that waits needs no core
                _backend.pop()
                _backend.pop()

        return fetch

    _registry.patch(dl.DataLoader, "__init__", make_init)
    _registry.patch(dl.DataLoader, "_get_iterator", make_get_iterator)
    _registry.patch(dl._BaseDataLoaderIter, "__next__", make_next)
    _registry.patch(fetch._MapDatasetFetcher, "fetch", make_fetch)
    _registry.patch(fetch._IterableDatasetFetcher, "fetch", make_fetch)
