"""Trace-replay simulator: replays a workload trace through ``scheduler.core``
with a simulated clock and no database. See docs/simulator.md.

    python -m scheduler.sim --trace FILE --format philly --cluster 64x8:V100 --policy fifo --json
"""

from __future__ import annotations

from .engine import Result, Simulator
from .trace import Job, Node, TraceError, parse_cluster_spec, read_cluster, read_trace

__all__ = [
    "Job",
    "Node",
    "Result",
    "Simulator",
    "TraceError",
    "parse_cluster_spec",
    "read_cluster",
    "read_trace",
]
