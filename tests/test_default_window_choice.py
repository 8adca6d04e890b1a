"""Where the default window starts, on the real step times of the shipped GPU samples (H100 captures of
whole runs): the rule in nvtx_autotrace.auto_window was set from these, and this keeps it honest. The
step times come from plain SQL over each export; the block means are recomputed here by hand."""

from __future__ import annotations

import importlib.util
import sqlite3
import statistics

import pytest
from conftest import SAMPLES, need
from question_snapshots import recorded_summary

SAMPLES_WITH_STEPS = ["resnet50_2workers_h100", "resnet50_8workers_h100", "resnet_ddp_flawed", "resnet_fixed",
                      "resnet_fixed_user", "resnet_flawed", "resnet_flawed_user"]


def step_starts(name: str) -> list[int]:
    """Start of each `step N` range of the first training process, in step order (plain SQL)."""
    with sqlite3.connect(SAMPLES / f"{name}.sqlite") as db:
        rows = db.execute("SELECT (e.globalTid >> 24) & 16777215, e.start, e.end FROM NVTX_EVENTS e "
                          "LEFT JOIN StringIds s ON s.id = e.textId WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*' "
                          "AND e.end IS NOT NULL ORDER BY e.start").fetchall()
    lead = rows[0][0]
    mine = [(start, end) for pid, start, end in rows if pid == lead]
    return [start for start, _ in mine] + [mine[-1][1]]  # boundary k = start of step k; the last end closes it


@pytest.mark.parametrize("name", SAMPLES_WITH_STEPS)
def test_the_window_starts_once_the_pace_settles_and_matches_the_whole_run(name):
    need("PyTorch", importlib.util.find_spec("torch") is not None)  # importing nvtx_autotrace imports torch
    from nvtx_autotrace import auto_window as aw

    starts = step_starts(name)
    durations = [b - a for a, b in zip(starts, starts[1:])]  # durations[k]: step k
    opened = None
    for n in range(aw.MIN_WARMUP, len(starts)):
        if aw.settled_at([s / 1e9 for s in starts[:n + 1]]):  # the times the process would have seen
            opened = n
            break
    assert opened is not None and 9 <= opened <= 16, opened
    # by hand: the 4 steps before the window against the 4 before them (step 0 never counts)
    last4 = statistics.mean(durations[opened - 4:opened])
    before = statistics.mean(durations[opened - 8:opened - 4])
    assert abs(last4 - before) <= 0.2 * before
    for n in range(9, opened):  # and no earlier boundary qualified
        a, b = statistics.mean(durations[n - 8:n - 4]), statistics.mean(durations[n - 4:n])
        assert abs(b - a) > 0.2 * a, n
    # the steps from the window on run at the steady pace the analyzer finds in the whole run (its summary,
    # tests/golden_questions): by the median, or the mean where the steps come in two kinds
    steady = recorded_summary(name)["steps"]["summary"]
    stat = "mean" if steady["modes"] else "median"
    after = getattr(statistics, stat)(durations[opened:-1])  # the last step runs into the program's end
    assert after == pytest.approx(steady[f"step_ns_{stat}"], rel=0.15 if steady["modes"] else 0.08), (after, stat)


def test_a_pace_that_keeps_changing_never_settles_and_the_cap_opens_the_window(monkeypatch):
    """Edge cases by construction: each step 15 % longer than the last never settles; after WARMUP_MAX_S the
    window opens anyway and says why; ranks of a distributed run open and close at fixed steps."""
    need("PyTorch", importlib.util.find_spec("torch") is not None)
    from nvtx_autotrace import auto_window as aw

    times = [0.0, 1.0]
    for k in range(1, 40):
        times.append(times[-1] + 0.1 * 1.15 ** k)
        assert not aw.settled_at(times)
    monkeypatch.setattr(aw, "_state", {"times": times, "distributed": False})
    n = len(times) - 1
    assert aw._warmup_over(n, now=times[1] + aw.WARMUP_MAX_S - 0.01) is None
    assert "capped at 30 s" in aw._warmup_over(n, now=times[1] + aw.WARMUP_MAX_S)
    assert not aw._window_full(aw.MIN_STEPS, aw.MIN_SECONDS - 0.1)  # 20 steps but under 5 s
    assert aw._window_full(aw.MIN_STEPS, aw.MIN_SECONDS)
    assert not aw._window_full(aw.FLOOR_STEPS - 1, aw.MAX_SECONDS + 60)  # slow steps: at least 3
    assert aw._window_full(aw.FLOOR_STEPS, aw.MAX_SECONDS)
    monkeypatch.setattr(aw, "_state", {"times": times, "distributed": False, "mode": "time"})  # a timed run
    assert not aw._window_full(aw.MIN_STEPS - 1, aw.MIN_SECONDS)
    assert not aw._window_full(aw.MIN_STEPS, aw.TIMED_MIN_SECONDS - 0.1)
    assert aw._window_full(aw.MIN_STEPS, aw.TIMED_MIN_SECONDS) and aw.TIMED_MIN_SECONDS < aw.MIN_SECONDS
    monkeypatch.setattr(aw, "_state", {"times": times, "distributed": True})
    assert aw._warmup_over(aw.DIST_WARMUP - 1, now=1e9) is None  # no time cap for ranks: they must agree
    assert "fixed warm-up" in aw._warmup_over(aw.DIST_WARMUP, now=0.0)
    assert not aw._window_full(aw.DIST_STEPS - 1, 1e9) and aw._window_full(aw.DIST_STEPS, 0.0)
