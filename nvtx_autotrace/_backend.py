"""Where ranges go: NVTX, nowhere, or a recorder (tests).

Call sites use ``_backend.push(name)`` / ``pop()`` / ``start(name)`` / ``end(handle)``
through the module attribute, so swapping the backend (``use``) rebinds all of them
at once. The NVTX backend keeps one registered-string event-attribute object per
name: a range then costs one dict lookup plus one C call (~0.1 µs without a profiler).
"""

from __future__ import annotations

import os
import threading
from typing import Callable

_MAX_NAMES = 20000  # distinct names kept registered; beyond that, names are built per call

push: Callable[[str], None]
pop: Callable[[], None]
start: Callable[[str], object]
end: Callable[[object], None]
warm: Callable[[str], None]  # register a name ahead of use (registration is slow under a profiler)
name: str = "none"


def injection_present(environ=os.environ) -> bool:
    """True when an NVTX tool (nsys, ...) will receive the calls; otherwise they are dropped anyway."""
    return bool(environ.get("NVTX_INJECTION64_PATH") or environ.get("NVTX_INJECTION32_PATH"))


def _noop(*_args) -> None:
    return None


class _Nvtx:
    """Default-domain NVTX ranges with cached registered strings."""

    def __init__(self) -> None:
        import nvtx
        from nvtx._lib import end_range, pop_range, push_range, start_range

        self._domain = nvtx.get_domain(None)
        self._handle = self._domain.handle
        self._attrs: dict[str, object] = {}
        self._raw = push_range, pop_range, start_range, end_range

    def attrs(self, name: str):
        a = self._attrs.get(name)
        if a is None:
            from nvtx._lib import EventAttributes, RegisteredString

            a = EventAttributes(RegisteredString(self._handle, name), None, None, None)
            if len(self._attrs) < _MAX_NAMES:  # unbounded name sets must not grow memory forever
                self._attrs[name] = a
        return a

    def forget(self) -> None:
        """After fork: the child registers its own strings with its own injection."""
        self._attrs.clear()

    def functions(self):
        push_range, pop_range, start_range, end_range = self._raw
        handle, cache, attrs = self._handle, self._attrs, self.attrs

        def push(name: str) -> None:
            a = cache.get(name)
            push_range(a if a is not None else attrs(name), handle)

        def pop() -> None:
            pop_range(handle)

        def start(name: str):
            a = cache.get(name)
            return start_range(a if a is not None else attrs(name), handle)

        return push, pop, start, end_range, attrs


class Recorder:
    """Test backend: remembers ``(kind, name_or_id, thread_name)`` for every call."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object, str]] = []
        self._next = 0
        self._lock = threading.Lock()

    def functions(self):
        def push(name: str) -> None:
            self.events.append(("push", name, threading.current_thread().name))

        def pop() -> None:
            self.events.append(("pop", None, threading.current_thread().name))

        def start(name: str):
            with self._lock:
                self._next += 1
                rid = (self._next, name)
            self.events.append(("start", rid, threading.current_thread().name))
            return rid

        def end(rid) -> None:
            self.events.append(("end", rid, threading.current_thread().name))

        return push, pop, start, end, _noop

    def names(self, kinds=("push", "start")) -> list[str]:
        return [e[1] if e[0] == "push" else e[1][1] for e in self.events if e[0] in kinds]

    def balanced(self) -> bool:
        """Every push popped (per thread) and every start ended."""
        depth: dict[str, int] = {}
        started, ended = set(), set()
        for kind, what, thread in self.events:
            if kind == "push":
                depth[thread] = depth.get(thread, 0) + 1
            elif kind == "pop":
                depth[thread] = depth.get(thread, 0) - 1
                if depth[thread] < 0:
                    return False
            elif kind == "start":
                started.add(what)
            else:
                ended.add(what)
        return not any(depth.values()) and started == ended


_nvtx: _Nvtx | None = None


def use(which) -> str:
    """Select the backend: "nvtx", "none", or an object with ``functions()`` (a Recorder)."""
    global push, pop, start, end, warm, name, _nvtx
    if which == "nvtx":
        if _nvtx is None:
            _nvtx = _Nvtx()
        push, pop, start, end, warm = _nvtx.functions()
        name = "nvtx"
    elif which == "none":
        push = pop = start = end = warm = _noop
        name = "none"
    else:
        push, pop, start, end, warm = which.functions()
        name = type(which).__name__
    return name


def after_fork_in_child() -> None:
    if _nvtx is not None:
        _nvtx.forget()


use("none")
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork_in_child)
