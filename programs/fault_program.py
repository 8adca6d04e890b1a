"""A training-shaped loop that misbehaves on request, for the fault and signal tests of ``nvtx-trace run``
(tests/test_run_signals.py). Standard library and the ``nvtx`` package only (no torch: it starts in well
under a second under nsys), each step an NVTX range ``step N`` and a line ``step N`` on stderr.

Faults: ``--raise-at N`` (an exception at step N; 0: before the loop), ``--exit-at N --code C``
(``sys.exit(C)`` at step N), ``--code C`` (at the end), ``--kill-self SIG --exit-at N`` (the program sends
itself a signal), ``--ignore-signals`` (SIGINT and SIGTERM ignored: only SIGKILL ends it), ``--orphan S``
(a child that outlives the program by S seconds), ``--workers N`` (children that loop until the program
ends them, like DataLoader workers), ``--spam MB`` (MB of output on stdout), ``--read-stdin`` (waits for a
line on stdin first); ``--print-every N`` prints every Nth step's line.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import subprocess
import sys
import time


def worker(parent: int) -> None:
    while os.getppid() == parent:  # ends when the program does, as DataLoader workers do (their watchdog)
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--exit-at", type=int, default=-1)
    p.add_argument("--code", type=int, default=0)
    p.add_argument("--kill-self", default=None, help="a signal name, sent at --exit-at")
    p.add_argument("--ignore-signals", action="store_true")
    p.add_argument("--orphan", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--spam", type=float, default=0.0)
    p.add_argument("--read-stdin", action="store_true")
    p.add_argument("--print-every", type=int, default=1)
    args = p.parse_args(argv)
    if args.raise_at == 0:
        raise RuntimeError("failed before the first step (--raise-at 0)")
    if args.ignore_signals:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.read_stdin:
        line = sys.stdin.readline()
        print(f"stdin gave {line!r}", file=sys.stderr, flush=True)
    if args.orphan:  # the marker (this file's path) is in its command line, for the tests to find it
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({args.orphan})", __file__, "orphan"])
    workers = [multiprocessing.get_context("fork").Process(target=worker, args=(os.getpid(),), daemon=True)
               for _ in range(args.workers)]
    for w in workers:
        w.start()
    if args.spam:
        chunk = "x" * 1023 + "\n"
        for _ in range(int(args.spam * 1024)):
            sys.stdout.write(chunk)
        sys.stdout.flush()
    try:
        import nvtx
    except ImportError:  # the ranges are a nicety: the faults do not need them
        nvtx = None
    for step in range(args.steps):
        if step == args.raise_at:
            raise RuntimeError(f"failed at step {step} (--raise-at)")
        if step == args.exit_at:
            if args.kill_self:
                os.kill(os.getpid(), getattr(signal, args.kill_self))
                time.sleep(5)
            sys.exit(args.code)
        if nvtx is not None:
            with nvtx.annotate(f"step {step}"):
                time.sleep(args.step_s)
        else:
            time.sleep(args.step_s)
        if step % args.print_every == 0:
            print(f"step {step}", file=sys.stderr, flush=True)
    print("done", flush=True)
    return args.code


if __name__ == "__main__":
    sys.exit(main())
