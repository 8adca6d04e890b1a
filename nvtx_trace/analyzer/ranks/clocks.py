"""Put several reports on one clock before they are merged.

Reports of one capture session (one nsys run: the same wall-clock start and session span) share a
clock. Reports of separate sessions (one nsys per rank, often one host each) count from their own
start on their own host's clock, so each session is moved onto the first report's clock:

* by the ends of the collectives they share, when both ran NCCL (or other communication) kernels:
  every rank leaves the same all-reduce at nearly the same instant, so with the collectives paired
  by order the median difference of their ends is the offset, good to their own skew (µs);
* else by the sessions' wall-clock start times (``utcEpochNs``), as good as the hosts' clock sync
  (about a millisecond with NTP), assuming each report counts from its session's start. On one host
  there is no sync to trust: on three two-H200 per-rank pairs the start times gave the offset of
  their collective ends to within 0.001-1.6 µs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nvtx_trace.analyzer.measures.collectives import COMM_KERNEL_RE
from nvtx_trace.analyzer.trace.decoded import DecodedReport
from nvtx_trace.units import ms

MIN_PAIRED = 3  # collectives needed to trust an offset taken from them
MAX_RESIDUAL_NS = 1_000_000  # paired ends farther apart than this after alignment: the pairing is wrong


@dataclass
class SessionClock:
    reports: list[int]  # indices of the reports captured in this session
    offset_ns: int  # added to their timestamps
    method: str  # "reference", "collective-ends", "session-start", "none"
    paired: int = 0  # collectives paired with the reference session
    residual_ns: int | None = None  # median distance of paired ends after alignment
    same_host: bool | None = None  # captured on the reference session's host (None: a host is unknown)


@dataclass
class ClockPlan:
    sessions: list[SessionClock]
    warnings: list[str] = field(default_factory=list)

    def offset_of(self, report: int) -> int:
        return next(s.offset_ns for s in self.sessions if report in s.reports)

    def session_of(self, report: int) -> int:
        return next(i for i, s in enumerate(self.sessions) if report in s.reports)

    @property
    def method(self) -> str:
        """``shared`` (one session), else the alignment used: ``collective-ends``, ``session-start``, ``mixed``."""
        used = {s.method for s in self.sessions[1:]}
        if not used:
            return "shared"
        return used.pop() if len(used) == 1 else "mixed"

    def how(self) -> str:
        if len(self.sessions) == 1:
            return "one capture session: the reports share its clock"
        parts = []
        for i, s in enumerate(self.sessions[1:], 1):
            what = {"collective-ends": f"on the ends of {s.paired} paired collectives (residual "
                                      f"{ms(s.residual_ns or 0)})",
                    "session-start": ("on the sessions' start times, read from one host's clock (good to µs: no "
                                      "clock sync involved)" if s.same_host else
                                      "on the sessions' wall-clock start times (as good as the hosts' clock sync)"),
                    "none": "not aligned (no collectives and no session start time): assumed shared"}[s.method]
            parts.append(f"session {i} ({len(s.reports)} report(s)) moved by {s.offset_ns / 1e6:+.3f} ms {what}")
        return f"{len(self.sessions)} capture sessions put on the first one's clock: " + "; ".join(parts)

    def to_json(self) -> dict:
        return {"method": self.method, "how": self.how(), "sessions": [
            {"reports": s.reports, "offset_ns": s.offset_ns, "method": s.method, "paired_collectives": s.paired,
             "residual_ns": s.residual_ns, "same_host": s.same_host} for s in self.sessions]}

    @property
    def needs_warning(self) -> bool:
        """Clocks moved by anything less certain than collective ends or one host's own clock."""
        return any(s.method in ("session-start", "none") and not s.same_host for s in self.sessions[1:])


def align(reports: list[DecodedReport]) -> ClockPlan:
    """The offset of each capture session to the first report's clock."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(reports):
        groups.setdefault(r.signature, []).append(i)
    sessions = list(groups.values())
    plan = ClockPlan([SessionClock(sessions[0], 0, "reference")])
    ref_ends = _collective_ends(reports, sessions[0])
    for members in sessions[1:]:
        plan.sessions.append(_align_session(reports, sessions[0], members, ref_ends, plan.warnings))
    return plan


def _align_session(reports, ref: list[int], members: list[int], ref_ends: np.ndarray, warnings: list[str]) \
        -> SessionClock:
    ends = _collective_ends(reports, members)
    best = _best_pairing(ref_ends, ends)
    if best is not None:
        offset, residual, n, lag = best
        if residual <= MAX_RESIDUAL_NS:
            if len(ends) != len(ref_ends) or lag:
                name, ref_name = reports[members[0]].path.name, reports[ref[0]].path.name
                warnings.append(f"{name}: {len(ends)} collectives against {len(ref_ends)} in {ref_name}; clocks "
                                f"aligned on {n} pairs, the first {abs(lag)} of {ref_name if lag > 0 else name} "
                                "left unpaired")
            return SessionClock(members, offset, "collective-ends", n, residual)
        warnings.append(f"{reports[members[0]].path.name}: its collectives do not pair with "
                        f"{reports[ref[0]].path.name}'s by order (ends {ms(residual)} apart after alignment); "
                        "aligned on the session start times instead")
    a, b = reports[ref[0]].utc_start_ns, reports[members[0]].utc_start_ns
    hosts = reports[ref[0]].host, reports[members[0]].host
    same_host = None if None in hosts else hosts[0] == hosts[1]
    if a is not None and b is not None:
        return SessionClock(members, int(b - a), "session-start", same_host=same_host)
    warnings.append(f"{reports[members[0]].path.name}: no collectives and no session start time to align its clock "
                    "with; assumed to share the first report's clock")
    return SessionClock(members, 0, "none")


def _best_pairing(ref: np.ndarray, ends: np.ndarray) -> tuple[int, int, int, int] | None:
    """Offset, residual, pairs and lag of the pairing by order that fits best. One capture may hold a few
    collectives the other missed (it started later): those leading ones are tried left out, both ways."""
    reach = min(abs(len(ref) - len(ends)) + 3, 64)
    best = None
    for lag in range(-reach, reach + 1):
        a, b = (ref[lag:], ends) if lag >= 0 else (ref, ends[-lag:])
        n = min(len(a), len(b))
        if n < MIN_PAIRED:
            continue
        diff = a[:n] - b[:n]
        offset = int(np.median(diff))
        residual = int(np.median(np.abs(diff - offset)))
        if best is None or residual < best[1]:
            best = (offset, residual, n, lag)
    return best


def _collective_ends(reports: list[DecodedReport], members: list[int]) -> np.ndarray:
    """End times of the communication kernels of the session's busiest communicating GPU, in issue order."""
    best = np.empty(0, np.int64)
    for i in members:
        r = reports[i]
        comm_ids = [k for k, name in r.strings.items() if COMM_KERNEL_RE.match(name or "")]
        if not comm_ids:
            continue
        ops = r.gpu_ops
        comm = ops[(ops["kind"] == 0).to_numpy() & ops["name_id"].isin(comm_ids).to_numpy()]
        for _, dev in comm.groupby("device_id", sort=True):
            ends = dev.sort_values("start_ns", kind="stable")["end_ns"].to_numpy()
            if len(ends) > len(best):
                best = ends
    return best
