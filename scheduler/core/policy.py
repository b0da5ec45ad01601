"""Policies are data: a frozen ``Policy`` names its queue order, placement and
knobs; presets are registered by name so regions, the simulator and the
benchmark pick one with a string.

Modes say how *running* work of a class may be treated:
* ``static``  - once placed, never preempted, reclaimed or moved;
* ``dynamic`` - may be preempted by a higher class, reclaimed when measured idle,
  and (if restartable) migrated to defragment;
* ``hybrid``  - each class gets its own mode from ``mode_per_class``.
A request can preempt only when ``preemption`` is on, and only victims of a
lower class whose mode is dynamic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

Mode: TypeAlias = Literal["static", "dynamic", "hybrid"]
QueueOrder: TypeAlias = Literal["fifo", "sjf", "srtf", "las", "drf", "priority", "gpucloud"]
QUEUE_ORDERS: tuple[str, ...] = ("fifo", "sjf", "srtf", "las", "drf", "priority", "gpucloud")


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    queue_order: QueueOrder = "gpucloud"
    placement: str = "frag-aware"
    mode: Mode = "static"
    mode_per_class: tuple[tuple[str, str], ...] = ()
    preemption: bool = False
    backfill: bool = False
    #: without backfill, a blocked request stops later requests for the same GPU
    #: model (strict FIFO); with backfill, it reserves instead.
    head_of_line: bool = False
    notice_s: float = 30.0
    #: bounded blast radius: one preemption evicts at most this multiple of what its
    #: request needs - GPU-seconds of remaining expected work when the request and
    #: every victim have estimates, else GPUs - and a reclaim at most this multiple
    #: of the waiting demand; ``math.inf``: no cap
    preempt_cap: float = 1.0
    topology: Literal["prefer", "require"] = "prefer"
    reclaim: bool = False
    reclaim_idle_util: float = 0.05
    reclaim_idle_s: float = 3600.0
    #: only reclaim when requests for the same GPU model are waiting
    reclaim_under_pressure: bool = True
    defrag: bool = False
    max_migrations: int = 8
    #: candidates scored per request (overrides the placement's k when set)
    k: int | None = None
    #: hosts examined per request before giving up for this cycle (speed bound)
    scan_limit: int = 2048
    #: feasible hosts examined when looking for preemption victims
    preempt_candidates: int = 8
    #: Tiresias-style discretised attained-service queues (GPU-seconds)
    las_thresholds: tuple[float, ...] = (3600.0, 36000.0, 360000.0)
    #: starvation guard: a request is promoted to the first queue once its age
    #: (now - submitted_at) reaches max(las_starve_s, las_starve_factor x its
    #: attained run time per GPU)
    las_starve_s: float = 4 * 3600.0
    las_starve_factor: float = 4.0
    #: preemption inside a class, for restartable batch work only (kind job,
    #: restartable): "las" - a request in a higher attained-service queue
    #: preempts jobs in lower ones; "srtf" - a request expected to finish sooner
    #: preempts jobs with more expected remaining time (oracle). "" = by class only.
    time_slice: Literal["", "las", "srtf"] = ""
    #: a job runs at least this long before a time-slice preemption (quantum)
    min_run_s: float = 600.0
    #: ((class, quantum_s), ...): the quantum of a listed class, overriding min_run_s
    slice_quantum: tuple[tuple[str, float], ...] = ()
    #: per-cycle depth cap: after this many requests could not start (waits and
    #: rejects), the rest of the queue waits unexamined this cycle. None = no cap.
    #: Placements are never capped.
    max_waits: int | None = None
    #: fixed fragmentation mix ((gpus_per_node, gpu_milli, weight), ...); empty =
    #: derive from the queue being planned
    mix: tuple[tuple[int, int, float], ...] = ()
    #: FGD target workload ((gpus_per_node, gpu_milli, vcpus, probability), ...)
    #: for gradient placements; empty = derive from the queue being planned
    workload: tuple[tuple[int, int, int, float], ...] = ()
    extra_filters: tuple[str, ...] = ()
    #: order inside a class and attained-service queue by learned durations
    #: (``PlacementRequest.estimated_duration``, QSSF); requests without one keep
    #: their age order. Read by the caller that fills the estimates
    learn_durations: bool = False

    def mode_for(self, priority: str) -> str:
        if self.mode != "hybrid":
            return self.mode
        for cls, mode in self.mode_per_class:
            if cls == priority:
                return mode
        return "static"

    def with_(self, **changes: object) -> Policy:
        return replace(self, **changes)  # type: ignore[arg-type]


POLICIES: dict[str, Policy] = {}


def register_policy(policy: Policy) -> None:
    POLICIES[policy.name] = policy


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None


register_policy(
    Policy(
        name="fifo",
        queue_order="fifo",
        placement="first-fit",
        head_of_line=True,
    )
)
register_policy(Policy(name="sjf", queue_order="sjf", placement="best-fit"))
# preemptive SRTF (oracle, for comparison) and Tiresias-style 2D-LAS: both
# preempt restartable batch jobs of their own class
register_policy(
    Policy(
        name="srtf",
        queue_order="srtf",
        placement="best-fit",
        mode="dynamic",
        preemption=True,
        time_slice="srtf",
        # SRTF evicts exactly the work expected to run longer than the request,
        # which a cap on remaining GPU-seconds would always refuse: no cap
        preempt_cap=math.inf,
    )
)
register_policy(
    Policy(
        name="las",
        queue_order="las",
        placement="best-fit",
        mode="dynamic",
        preemption=True,
        time_slice="las",
    )
)
register_policy(Policy(name="drf", queue_order="drf", placement="best-fit"))
register_policy(
    Policy(
        name="priority",
        queue_order="priority",
        placement="best-fit",
        mode="dynamic",
        preemption=True,
        backfill=True,
    )
)
register_policy(
    Policy(
        name="gpucloud",
        queue_order="gpucloud",
        placement="frag-aware",
        mode="hybrid",
        # critical work is never disturbed; standard may be preempted by critical;
        # low (and spot under it) is preempted first and reclaimed when idle
        mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic")),
        preemption=True,
        backfill=True,
        topology="require",
        reclaim=True,
        # least attained service inside a class, for restartable batch work only
        # (instances are never preempted but by class)
        time_slice="las",
        # score the two fullest feasible hosts: packing already comes from the
        # bucket walk, so more candidates buy little and cost ~25 % throughput
        k=2,
        # shortest expected service first inside a class and LAS queue, from the
        # tenant's history (issue 33); least attained service where it is thin
        learn_durations=True,
    )
)
