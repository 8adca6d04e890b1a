"""The default of ``nvtx-trace run`` (no ``--warmup-steps/--steps``, no ``--full``): a capture window that
the program picks itself after warm-up (nvtx_autotrace/auto_window.py says how and why), then the
program is stopped, so that any script answers in minutes.

The runner calls three things: :func:`arm` while planning, :func:`outcome` after nsys returns (the one
line saying which steps were profiled and why), and :func:`full_plan` when the program ended before
its window opened: nsys then wrote nothing, and a program that short is cheap to profile in full.
A fixed window (``--warmup-steps N --steps M``) keeps a decisions file too (:func:`decisions_file`), for
:func:`fixed_outcome` to say so when the program ended before step N.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tempfile
from pathlib import Path

from nvtx_trace import names
from nvtx_trace.capture import interrupts

AUTO_ENV = names.AUTO_WINDOW_ENV  # read by nvtx_autotrace.auto_window
FILE_ENV = names.WINDOW_FILE_ENV


@dataclasses.dataclass
class Outcome:
    line: str  # what was profiled and why, for the user
    opened: bool  # a window was captured (steps or time)
    stepped: bool  # the window starts at a step boundary (the analyzer need not skip warm-up)
    ended_in_warmup: bool = False  # the program ended before any window opened
    beyond_end: bool = False  # a fixed window starts after the step the program ended at (it exited 0)


def applies(opts) -> bool:
    """The default window needs nvtx_autotrace's step counter and no explicit choice."""
    return opts.steps is None and not getattr(opts, "full", False) and opts.autotrace


def arm(env: dict, cmode: str, keep_running: bool) -> tuple[Path, str]:
    """Set the program's variables; returns (the decisions file to read afterwards, what is profiled in words)."""
    path = decisions_file(env)
    env[AUTO_ENV] = cmode + ("" if keep_running else ":exit")
    words = ("a window chosen after warm-up (the step pace settled; at least 20 steps and 5 s, at most about 20 s)"
             + ("" if keep_running else ", then the program is stopped (--full: profile everything; "
                                        "--keep-running: let it finish)"))
    return path, words


def decisions_file(env: dict) -> Path:
    """A fresh file for the program's window decisions, named in its environment (nothing is created here)."""
    path = Path(tempfile.gettempdir()) / f"nvtx-trace-window-{os.getpid()}-{secrets.token_hex(6)}.jsonl"
    env[FILE_ENV] = str(path)
    return path


def fixed_outcome(path: Path | list[dict] | None, exit_code: int, window: tuple[int, int]) -> Outcome | None:
    """``--warmup-steps N --steps M``: None when the window opened (or nothing is known), else the line saying
    that the program ended after K steps, before step N, and what to run instead. ``path``: the decisions file,
    or its events already read."""
    if path is None:
        return None
    ended = [e for e in _written(path) if e.get("event") == "ended" and e.get("window")]
    if not ended or any(e.get("opened") for e in ended):
        return None
    first, count = window
    steps = max(int(e.get("steps") or 0) for e in ended)  # the process that trained (a launcher counts none)
    if steps >= first:
        return None
    if exit_code != 0:
        status = f"status {exit_code}" if exit_code >= 0 else f"signal {-exit_code}"
        return Outcome(f"the program ended ({status}) after {steps} step(s), before its capture window opened at "
                       f"step {first}: nothing was profiled; its own message is above", False, True)
    if steps > count:
        instead = f"--warmup-steps {steps - count} or less with --steps {count}, or --full"
    elif steps > 1:
        instead = f"--warmup-steps 1 --steps {steps - 1}, or --full"
    else:
        instead = "--full (it ran no whole step)"
    return Outcome(f"the program ended after {steps} step(s), before its capture window opened at step {first} "
                   f"(--warmup-steps {first}): nothing was profiled; run it again with {instead}", False, True,
                   beyond_end=True)


def events(path: Path) -> list[dict]:
    """The JSON lines the program's auto_window (and losses) wrote, read once; the file is removed."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    finally:
        path.unlink(missing_ok=True)
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _written(path: Path | list[dict]) -> list[dict]:
    return path if isinstance(path, list) else events(path)


def out_of_memory(written: list[dict] | None) -> dict | None:
    """The first out-of-memory record a process of the program wrote (nvtx_autotrace/memory.py), or None."""
    return next(({k: v for k, v in e.items() if k not in ("event", "pid", "rank")}
                 for e in written or [] if e.get("event") == "oom"), None)


def outcome(path: Path | list[dict] | None, exit_code: int, interrupted_by: int | None = None) -> Outcome | None:
    """What the program's window did, from its decisions (the lead process: rank 0, else the first). ``path``:
    the decisions file, or its events already read. ``interrupted_by``: the signal the tool passed on; a program
    may catch it and end with status 0 (Lightning's "graceful shutdown"), which is still no end of its own."""
    if path is None:
        return None
    written = _written(path)
    status = f"status {exit_code}" if exit_code >= 0 else f"signal {-exit_code}"
    if not written:
        if exit_code != 0:  # it failed before torch was imported (its arguments, its imports): --full would not help
            return Outcome(f"the program ended ({status}) before it imported torch: nothing was profiled; its own "
                           "message is above (or, if it never started, nsys's in nsys.log)", False, False)
        return Outcome("no capture window was armed (the program never imported torch with nvtx_autotrace): "
                       "nothing was profiled; nvtx-trace run --full profiles the whole run", False, False)
    lead = next((e["pid"] for e in written if e.get("rank") == "0"),
                next((e["pid"] for e in written if e["event"] == "opened"), written[0]["pid"]))
    mine = {e["event"]: e for e in written if e["pid"] == lead}
    opened, closed, ended = mine.get("opened"), mine.get("closed"), mine.get("ended")
    if opened is None:
        steps = ended.get("steps") if ended else None
        at = f", {ended['at_s']:.1f} s" if ended and ended.get("at_s") is not None else ""
        if exit_code == 0:
            return Outcome(f"the program ended after {steps} step(s){at}, during warm-up, before the default window "
                           "opened: it runs again, profiled in full (--full)", False, False, ended_in_warmup=True)
        full = (f": fix the error its message above names and run again (nvtx-trace run --full profiles the {steps} "
                "step(s) before it fails)" if steps else "; its own message is above")
        return Outcome(f"the program ended ({status}) after {steps} step(s){at}, before the default window "
                       f"opened: nothing was profiled{full}", False, False)
    if opened.get("step") is None:
        span = (f"{closed['seconds']:.0f} s" if closed else "until the program was interrupted" if interrupted_by
                else "until the program ended")
        return Outcome(f"profiled {span} from {opened['at_s']:.0f} s after start: {opened['why']}; steps are "
                       "inferred from the rhythm of the work", True, False)
    first = opened["step"]
    if closed:
        last = closed["step"] - 1
        tail = "; the program was stopped after them" if closed.get("stopping") else ""
        return Outcome(f"profiled steps {first}-{last} ({closed['steps']} steps, {closed['seconds']:.1f} s) after "
                       f"{first} warm-up steps: {opened['why']}{tail}", True, True)
    last = f"-{ended['steps'] - 1}" if ended and ended.get("steps") else ""
    stopped = {int(s) for s in interrupts.SIGNALS}  # by a signal of those the tool passes on, or its 128 + N
    end = (f"until the program was interrupted ({interrupts.signal_name(interrupted_by)}), {status}" if interrupted_by
           else "to the program's end" if exit_code == 0 else
           f"until the program was stopped, {status}" if -exit_code in stopped or exit_code - 128 in stopped
           else f"until the program ended, {status}")
    return Outcome(f"profiled steps {first}{last} ({end}) after {first} warm-up steps: {opened['why']}", True, True)


def ran_again(outcome: Outcome) -> tuple[str, Outcome]:
    """(the notice before the second run, the outcome that the report then states) for a program that ended
    during warm-up."""
    before = outcome.line
    after = outcome.line.replace("it runs again, profiled in full (--full)", "so it was run again, profiled in full "
                                 "(--full)")
    return before, dataclasses.replace(outcome, line=after, ended_in_warmup=False)


def full_plan(plan):
    """The same run without the default window: nsys options and variables as ``--full`` plans them."""
    env = {k: v for k, v in plan.env.items() if k not in (AUTO_ENV, FILE_ENV)}
    extra, skip = [], False
    for item in plan.extra:
        if skip:
            skip = False
            continue
        if item == "--nvtx-capture":
            skip = True
            continue
        if item.startswith("--capture-range"):
            continue
        extra.append(item)
    return dataclasses.replace(plan, env=env, extra=extra, capture="the whole run", window_file=None)
