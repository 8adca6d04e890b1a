"""Which rows of an export can be real: the sanity bounds every table's times are checked against.

Corrupt rows (int64-max or negative stamps, rows ending before they start) would otherwise
stretch the trace over centuries, fill the GPU to "100 % busy" and flip findings; they are
left out and counted in a warning by the caller.
"""

from __future__ import annotations

import numpy as np

SESSION_SLACK_NS = 1_000_000_000


def session_on_event_clock(reader) -> tuple[int, int] | None:
    """The capture session on the events' own clock, or None when it cannot be told.

    Exports of a whole run stamp events on the session's clock (startTime..stopTime); exports of a
    capture range stamp them from 0 to its duration. The first rows of the NVTX and kernel tables
    say which; when neither base holds them, nothing is dropped for being outside.
    """
    if reader.info.session is None:
        return None
    lo, hi = reader.info.session
    probes = reader.first_starts()
    for base in ((lo, hi), (0, hi - lo)):
        if probes and all(base[0] - SESSION_SLACK_NS <= p <= base[1] + SESSION_SLACK_NS for p in probes):
            return base
    return None


def plausible(start: np.ndarray, end: np.ndarray, session: tuple[int, int] | None) -> np.ndarray:
    """GPU rows that can be real: after 0, not ending before they start, inside the session (1 s slack)."""
    ok = (start > 0) & (end >= start)
    if session is not None:
        lo, hi = session
        ok &= (start >= lo - SESSION_SLACK_NS) & (end <= hi + SESSION_SLACK_NS)
    return ok


def corrupt_ranges(start: np.ndarray, end: np.ndarray, is_open: np.ndarray,
                   session: tuple[int, int] | None) -> np.ndarray:
    """NVTX ranges that cannot be real. A range may begin before a capture range starts (nsys stamps it
    early) or stay open: only one ending before it starts, or lying wholly outside the session, is corrupt."""
    bad = ~is_open & (end < start)
    if session is not None:
        lo, hi = session
        bad |= (start > hi + SESSION_SLACK_NS) | (~is_open & (end < lo - SESSION_SLACK_NS))
    return bad


def listed_devices(reader) -> np.ndarray | None:
    """GPU ids the report's own device table lists (None when it has none to check against)."""
    ids = reader.listed_gpu_ids()
    return np.array(ids, np.int64) if ids else None


def on_listed_devices(device_id: np.ndarray, listed: np.ndarray | None) -> np.ndarray | None:
    """Mask of GPU rows on a listed device, or None when there is nothing to drop. A row on a device the
    report does not list is corrupt (a "GPU 7" with three kernels would become a 99 %-idle finding); if no
    row matches at all, the ids mean something else in this export and every row is kept."""
    if listed is None or not len(device_id):
        return None
    ok = np.isin(device_id, listed)
    return None if ok.all() or not ok.any() else ok
