"""Plain timing, apart from any verb: ``try`` and ``tune`` both judge knobs on the steady step of these runs.

Each run is ``python -m nvtx_autotrace SCRIPT ARGS`` with no profiler attached, so nvtx_autotrace keeps only
its step counter (a few µs a step) and the knobs; the default window (auto_window, mode ``time``) skips the
warm-up until the pace settles, times the steps that follow at the step boundaries the counter already
marks (no sync added), and stops the program. Baseline and variants alternate (A B B A ...) so drift on a
shared machine falls on both. A step time is the median of a round's steps, or the mean when they are
uneven (the rule ``diff`` uses); a variant's step is the median of its rounds.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nvtx_trace import knobs as declared
from nvtx_trace import names
from nvtx_trace.analyzer.measures.step_times import typical_statistic
from nvtx_trace.capture import interrupts, lifeline, processes
from nvtx_trace.errors import NvtxTraceError
from nvtx_trace.files import socket_room, variant_folder
from nvtx_trace.runner import default_window

RUN_TIMEOUT_S = 900  # one run: start-up and compilation, warm-up (at most 30 s once steps run), the window
LOSSES = 5  # steps whose loss is compared with the baseline's (warm-up steps: read once, before any timed step)


@dataclass
class Round:
    step_ms: list[float]  # the timed window's steps
    statistic: str  # median or mean (uneven steps)
    value_ms: float | None
    changes: list[dict]  # what the knobs said they changed: the program's records ({knobs, applied, line})
    returncode: int
    why: str = ""  # why there is no value
    losses: list[float | None] = field(default_factory=list)  # the first steps' losses (LOSSES steps)
    log: Path | None = None  # the run's stderr, kept
    compiled_ms: list[float] = field(default_factory=list)  # steps left out: torch.compile made a graph in them
    parts: dict = field(default_factory=dict)  # where the run's wall time went (run_parts)

    def unapplied(self, knobs: dict) -> list[str]:
        """The knobs that changed nothing in this run: refused (a record with ``applied`` false), or never reached
        (no record names them: no DataLoader built, empty_cache never called, no step 1)."""
        done = {k for c in self.changes if c.get("applied") for k in (c.get("knobs") or {})}
        return [k for k in knobs if k not in done]

    def lines(self, knobs: dict | None = None) -> list[str]:
        """The records' lines, as the program printed them; those naming one of ``knobs`` where given."""
        return [c.get("line") or "" for c in self.changes if knobs is None or set(c.get("knobs") or ()) & set(knobs)]


def _pick(statistic: str):
    return statistics.median if statistic == "median" else statistics.fmean


@dataclass
class Variant:
    knobs: dict  # every knob nvtx_autotrace applies in the run
    rounds: list[Round] = field(default_factory=list)
    added: dict | None = None  # the knobs tried on top of the baseline's (tune); None: all of ``knobs``
    program: list[str] | None = None  # its own command line (tune: the program's options set), else the target's
    via_options: dict = field(default_factory=dict)  # knobs the program's own options apply: knob -> its words

    @property
    def label(self) -> str:
        said = [" ".join(w) for w in self.via_options.values()]
        return ",".join(filter(None, [declared.text(self.knobs), *said])) or "baseline"

    @property
    def trial(self) -> dict:
        """The knobs this variant is about: those it adds to the baseline's."""
        return self.knobs if self.added is None else self.added

    def per_round(self, statistic: str) -> list[float | None]:
        """Each round's step in one statistic (median or mean of its steps); None for a round without steps."""
        pick = _pick(statistic)
        return [pick(r.step_ms) if r.step_ms else None for r in self.rounds]

    def per_half(self, statistic: str) -> list[float]:
        """Each round's step over its first and its second half of steps: a round that sped up or slowed down as
        it ran (a machine whose load comes and goes) shows it here, where its one value hides it."""
        pick = _pick(statistic)
        out = []
        for r in self.rounds:
            half = len(r.step_ms) // 2
            parts = [r.step_ms[:half], r.step_ms[half:]] if half else [r.step_ms]
            out += [pick(p) for p in parts if p]
        return out

    def value(self, statistic: str) -> float | None:
        values = [v for v in self.per_round(statistic) if v is not None]
        return statistics.median(values) if values else None

    @property
    def statistic(self) -> str:
        """Mean when the steps are uneven (the rule diff uses), judged on the median of the rounds."""
        median, mean = self.value("median"), self.value("mean")
        return typical_statistic(median or 0, mean or 0, None) if median else "median"

    @property
    def step_ms(self) -> float | None:
        return self.value(self.statistic)

    @property
    def unapplied(self) -> list[str]:
        """Knobs that changed nothing, judged on the first round that timed its steps (a round that crashed or
        was stopped before step 1 says nothing about the knobs)."""
        ran = next((r for r in self.rounds if r.value_ms is not None), None)
        mine = {k: v for k, v in self.trial.items() if k not in self.via_options}  # an option is no knob record
        return ran.unapplied(mine) if ran is not None and mine else []

    @property
    def inert(self) -> bool:
        """Every knob tried changed nothing: the variant is the baseline's program."""
        return bool(self.trial) and set(self.unapplied) == set(self.trial)

    def changed(self) -> list[str]:
        """What its trial changed: the knobs' records' lines and the options set on its command line."""
        options = [f"{' '.join(w)}: the program's own option ({k})" for k, w in self.via_options.items()
                   if k in self.trial]
        return sorted({ln for r in self.rounds for ln in r.lines(self.trial)} | set(options))


def time_once(target: list[str], knobs: dict, python: str | None = None, cwd: Path | None = None,
              timeout: float | None = None, log: Path | None = None) -> Round:
    """One run of the program, timed in the default window, with ``knobs`` applied; its stderr kept in ``log``."""
    with tempfile.TemporaryDirectory(prefix="nvtx-trace-try-") as tmp:
        window = Path(tmp) / "window.jsonl"
        env = dict(os.environ)
        for key in (names.CAPTURE_ENV, names.TRY_ENV):
            env.pop(key, None)
        env.update({names.AUTO_WINDOW_ENV: "time:exit", names.WINDOW_FILE_ENV: str(window),
                    names.AUTOTRACE_ENV: "auto", names.LOSSES_ENV: str(LOSSES), "PYTHONUNBUFFERED": "1"})
        _private_tmp(env, tmp)
        if knobs:
            env[names.TRY_ENV] = declared.to_json(knobs)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = command(target, python)
        log = log or Path(tmp) / "stderr.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        began, began_at = time.monotonic(), time.time()
        with open(log, "w", encoding="utf-8", errors="replace") as err:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err, **processes.OWN_GROUP)  # a worker forked as it is ended dies with it
            line = lifeline.tie(proc, [tmp])  # a SIGKILL of ours takes the program, its workers, this folder
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                interrupts.send([*processes.descendants(proc.pid), proc.pid], signal.SIGKILL)
                proc.wait()
                return Round([], "median", None, [], -1, f"the run was stopped after {timeout:.0f} s (the default "
                                                         "window takes at most about two minutes after start-up)",
                             log=log)
            finally:
                if proc.returncode is not None:
                    leftover = processes.group_members(proc.pid)  # its workers, where it left without them
                    if leftover:
                        interrupts.send(leftover, signal.SIGKILL)
                    line.release()
        wall = time.monotonic() - began
        stderr = log.read_text(encoding="utf-8", errors="replace")
        events = default_window.events(window)
        kept = log if log.parent != Path(tmp) else None
    events = _lead_rank(events)
    changes = [e for e in events if e.get("event") == "knob"]
    closed = next((e for e in reversed(events) if e.get("step_ms")), {})
    steps, compiled = closed.get("step_ms"), set(closed.get("compiled") or ())
    compiled_ms = [t for i, t in enumerate(steps or ()) if i in compiled]
    if compiled and len(compiled) < len(steps):  # a compilation is paid once: it is no step's pace
        steps = [t for i, t in enumerate(steps) if i not in compiled]
    else:
        compiled_ms = []
    losses = next((e.get("values") or [] for e in events if e.get("event") == "losses"), [])
    if not steps:
        said = {f"nvtx-trace try: {c.get('line')}" for c in changes}
        tail = [ln for ln in stderr.strip().splitlines() if ln not in said][-1:] or [""]
        why = ("the program ended before its pace settled" if proc.returncode == 0 else
               f"the program exited with status {proc.returncode}: {tail[0][:200]}")
        return Round([], "median", None, changes, proc.returncode, why + (f" (its output: {kept})" if kept else ""),
                     losses, kept)
    median, mean = statistics.median(steps), statistics.fmean(steps)
    stat = typical_statistic(median, mean, None)
    return Round(steps, stat, median if stat == "median" else mean, changes, proc.returncode, "", losses, kept,
                 compiled_ms, run_parts(events, wall, began_at))


def run_parts(events: list[dict], wall_s: float, began_at: float) -> dict:
    """Where a timed run's wall time went, in seconds, from the window's own notes and the wall clock the run
    began at: ``start_s`` until its first step ended (the interpreter, imports, building the model and data, the
    first step's compilation), ``warmup_s`` until the pace settled, ``window_s`` timed (until the window closed,
    or the program ended), ``end_s`` its exit after that; {} where no window opened."""
    opened = next((e for e in events if e.get("event") == "opened"), {})
    closed = next((e for e in events if e.get("event") == "closed"), None) or next(  # else the program ended first
        (e for e in events if e.get("event") == "ended" and e.get("step_ms")), {})
    first, at_open, at_close = opened.get("first_step_s"), opened.get("at_s"), closed.get("at_s")
    if first is None or at_open is None or at_close is None:
        return {}
    before = max(0.0, (opened.get("installed_at") or began_at) - began_at)  # until nvtx_autotrace was imported
    return {"wall_s": round(wall_s, 2), "start_s": round(before + first, 2), "warmup_s": round(at_open - first, 2),
            "window_s": round(at_close - at_open, 2), "end_s": round(max(0.0, wall_s - before - at_close), 2)}


SOCKET_SPARE = 8  # bytes our folder leaves spare for multiprocessing's sockets (files.socket_room)


def _private_tmp(env: dict, tmp: str) -> None:
    """The timed program's temporary files go to our folder, removed after the run: it leaves as its window closes
    (auto_window), and its DataLoader workers' multiprocessing folders (pymp-*, one a worker) stayed behind in the
    user's. Inductor's compile cache stays where it was (its default is under the temporary folder): warm across
    the runs of one tune, as without the tool. Not where the folder's path is long: multiprocessing's sockets live in
    it (``pymp-*/listener-*``), and a Unix socket's path has 107 bytes at most (the workers failed to start)."""
    if socket_room(tmp) < SOCKET_SPARE:
        return
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        import getpass
        import re

        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid: Inductor falls back the same way
            user = str(os.getuid())
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                      "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    env["TMPDIR"] = tmp


def command(target: list[str], python: str | None = None) -> list[str]:
    """The plain run: ``python -m nvtx_autotrace SCRIPT ARGS``; a torchrun job starts that in each rank
    (``torchrun [its options] --no-python python -u -m nvtx_autotrace SCRIPT ARGS``)."""
    from nvtx_trace.capture import torchrun

    launch = torchrun.parse(target)
    if launch is not None and launch.program and launch.kind != "command":
        return [*launch.launcher, "--no-python", *launch.rank_argv(python)]
    return [python or sys.executable, "-m", "nvtx_autotrace", *target]


def _lead_rank(events: list[dict]) -> list[dict]:
    """Rank 0's decisions (every rank of a torchrun job appends to one window file; they step together, each
    stopping after the same fixed count): one rank's steps and losses, not the ranks' interleaved."""
    ranks = {e.get("rank") for e in events}
    if len(ranks) < 2:
        return events
    lead = "0" if "0" in ranks else sorted(r for r in ranks if r is not None)[0]
    return [e for e in events if e.get("rank") == lead]


def loss_difference(base: list, other: list) -> float | None:
    """The largest relative difference between two runs' losses over the steps both recorded."""
    pairs = [(a, b) for a, b in zip(base, other) if a is not None and b is not None and a == a and b == b]
    if not pairs:
        return None
    return max(abs(b - a) / max(abs(a), 1e-12) for a, b in pairs)


def first_losses_moved(base: Variant, other: Variant) -> float | None:
    """How far the other's first round's losses are from the baseline's first round's (loss_difference)."""
    return loss_difference(base.rounds[0].losses, other.rounds[0].losses) if base.rounds and other.rounds else None


def loss_noise(base: Variant) -> float | None:
    """How far the baseline's own losses move between its rounds: below this, a difference is noise."""
    runs = [r.losses for r in base.rounds if r.losses]
    diffs = [d for other in runs[1:] if (d := loss_difference(runs[0], other)) is not None]
    return max(diffs) if diffs else None


def compare(target: list[str], knob_sets: list[dict], rounds: int = 2, python: str | None = None,
            progress=None, logs: Path | None = None, base: dict | None = None) -> list[Variant]:
    """The baseline and each knob set, ``rounds`` times each, alternating; the baseline first in the list.
    ``base``: knobs the baseline runs with (tune's configuration so far), each knob set applied on top.
    A variant whose knobs changed nothing in its first round is not run again (its timing is the baseline's
    program); each run's stderr goes to ``logs/<variant>/round-N.log``."""
    if base:
        variants = [Variant(dict(base), added={}), *(Variant({**base, **k}, added=dict(k)) for k in knob_sets)]
    else:
        variants = [Variant({}), *(Variant(k) for k in knob_sets)]
    return alternate(target, variants, rounds, python, progress, logs)


def alternate(target: list[str], variants: list[Variant], rounds: int, python: str | None = None, progress=None,
              logs: Path | None = None, settled=None) -> list[Variant]:
    """Each variant ``rounds`` times, alternating (A B B A ...), the first the baseline; each runs its own command
    line where it has one. ``settled(variants)``: a reason to stop before the rounds are done (tune: the verdict
    can no longer change), said through ``progress``."""
    for r in range(rounds):
        order = variants if r % 2 == 0 else list(reversed(variants))
        for v in order:
            if v.inert or len(v.rounds) > r:  # inert, or this round of it was measured already (tune: reused)
                continue
            why = settled(variants) if settled and r else None
            if why:
                if progress:
                    progress(f"round {r + 1}/{rounds}: not run: {why}")
                return variants
            interrupts.stage(f"in round {r + 1}/{rounds} ({v.label})")
            if progress:
                progress(f"round {r + 1}/{rounds}: {v.label}")
            log = logs / variant_folder(v.label) / f"round-{r + 1}.log" if logs else None
            v.rounds.append(time_once(v.program or target, v.knobs, python, timeout=RUN_TIMEOUT_S, log=log))
            if v is variants[0] and not any(x.step_ms for x in v.rounds):  # no variant runs against nothing
                raise NvtxTraceError(f"the baseline run gave no step times: {v.rounds[-1].why}; nvtx-trace try needs "
                                     "a training loop that calls optimizer.step() (or nvtx_autotrace.mark_step()) "
                                     "for at least ~30 steps")
    return variants
