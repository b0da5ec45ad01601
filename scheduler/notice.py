"""A preemption notice: kept as data, put into words where a person reads it. Pure.

Three things give a workload notice: the scheduler's preemptions and reclaims
(scheduler/apply.py), a spot price above the owner's max price (billing), and a host
drained for maintenance (agents). All of them go through one service,
`scheduler.services.workloads_notice`, which stores two facts on the workload:

    Workload.stop_by     when the notice runs out (the cycle then ends it as PREEMPTED)
    Workload.stop_cause  why ("host gpu-3 is draining"), with no countdown in it

The countdown is words, rendered from `stop_by` when it is shown (`notice_text`: the
API's `reason`, the console, and so the CLI); nothing parses the words back. When the
notice is served (it ran out, or the job stopped under it), the workload ends with its
cause (`notice_served`).
"""
from __future__ import annotations

from datetime import UTC, datetime

# The cause of a notice given without one (none of today's givers does).
_NO_CAUSE = "preempted"


def notice_text(cause: str, stop_by: datetime) -> str:
    """What the owner reads while the notice runs: why, and when it stops (UTC)."""
    return f"{notice_served(cause)}; stopping at {stop_by.astimezone(UTC):%H:%M:%S} UTC"


def notice_served(cause: str) -> str:
    """The reason a workload ends with when its notice is served: the cause alone."""
    return cause or _NO_CAUSE
