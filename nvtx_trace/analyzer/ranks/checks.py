"""One report per rank: can these reports be ranks of one run? Checked before they are merged (the per-rank rows
after the analysis are questions/per_rank.py's)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from nvtx_trace.errors import BadReportError

if TYPE_CHECKING:  # only named in annotations: decoded reads reports, ranks compares them
    from nvtx_trace.analyzer.trace.decoded import DecodedReport

SAME_RUN_SLACK_NS = 60_000_000_000  # reports of one job start within a minute of each other's span


def check_reports(reports: list[DecodedReport]) -> None:
    """One clear line for inputs that cannot be ranks of one run: empty, the same twice, different runs."""
    for r in reports:
        if not len(r.gpu_ops) and not len(r.ranges):
            raise BadReportError(f"{r.path}: holds no GPU activity and no NVTX ranges, so it adds nothing to the "
                                 "analysis; capture every rank with: nsys profile -t cuda,nvtx")
    for i, a in enumerate(reports):
        for b in reports[i + 1:]:
            shared = a.active_pids() & b.active_pids()
            if a.signature == b.signature and shared:
                raise BadReportError(f"{a.path} and {b.path} hold the same process(es) of one capture (pid "
                                     f"{', '.join(map(str, sorted(shared)[:3]))}): the same report twice? pass each "
                                     "rank's report once")
            if not _overlap(a, b):
                raise BadReportError(f"{a.path} (captured {_when(a)}) and {b.path} (captured {_when(b)}) come from runs "
                                     "that did not overlap in time, so they are not ranks of one job; pass the "
                                     "reports of one run")


def _span(r: DecodedReport) -> tuple[int, int] | None:
    if r.utc_start_ns is None or r.session is None:
        return None
    return r.utc_start_ns, r.utc_start_ns + (r.session[1] - r.session[0])


def _overlap(a: DecodedReport, b: DecodedReport) -> bool:
    sa, sb = _span(a), _span(b)
    if sa is None or sb is None:
        return True  # cannot tell: trust the user
    return sa[0] - SAME_RUN_SLACK_NS <= sb[1] and sb[0] - SAME_RUN_SLACK_NS <= sa[1]


def _when(r: DecodedReport) -> str:
    return datetime.fromtimestamp(r.utc_start_ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
