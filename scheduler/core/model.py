"""The core's data model: frozen snapshots in, frozen decisions out.

Everything here is plain data so the three callers (the live Celery loop via
``scheduler/snapshot.py`` / ``scheduler/apply.py``, the trace simulator and the
benchmark) build the same objects. Times are seconds on the caller's clock
(epoch seconds live, simulated seconds in the simulator); the core never reads
a clock itself, ``plan(..., now=...)`` is the only source of "now".

Units: GPU shares are milli-GPUs (1000 = one whole GPU), memory is MiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from .blockers import Blocker

Priority: TypeAlias = Literal["critical", "standard", "low"]
Billing: TypeAlias = Literal["on_demand", "spot"]
Kind: TypeAlias = Literal["instance", "job"]

#: Lower rank = more important. Queue order and preemption both use this.
CLASS_RANK: dict[str, int] = {"critical": 0, "standard": 1, "low": 2}
CLASSES: tuple[Priority, ...] = ("critical", "standard", "low")

WHOLE = 1000  # milli-GPUs in one GPU

#: ``GpuView.share_tenant`` of a GPU whose shares belong to more than one tenant
#: although it is not open to cross-tenant sharing (left over from before the
#: rule, or an operator turned sharing off): no tenant may add a share until it drains
SEVERAL_TENANTS = "\x00several"


# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True, slots=True)
class GpuView:
    """One physical GPU as the control plane last saw it.

    ``whole`` and ``used_milli`` are exclusive: a GPU is either held whole by one
    allocation, or carries fractional shares summing to ``used_milli`` (<= 1000),
    or is free (``not whole and used_milli == 0``).

    Tenant isolation (docs/scheduler.md): ``share_tenant`` is the tenant whose
    shares the GPU carries (``SEVERAL_TENANTS`` when more than one tenant's do);
    a GPU with shares and no ``share_tenant`` counts as held by an unknown tenant,
    so an adapter that forgets it fails closed. ``cross_tenant`` marks a GPU whose
    shares may belong to different tenants at once: hardware-partitioned (MIG) or
    a GPU model the operator opened to sharing; ``share_tenant`` is then ignored.
    """

    uuid: str
    index: int
    model: str
    nvlink_island: int = 0
    numa_node: int = 0
    whole: bool = False
    used_milli: int = 0
    utilisation: float = 0.0  # measured, 0..1, recent average from the agent
    idle_since: float | None = None  # since when utilisation stayed below the idle threshold
    share_tenant: str | None = None
    cross_tenant: bool = False


@dataclass(frozen=True, slots=True)
class HostView:
    """A host and its GPUs. ``total_*`` of 0 means "unknown, use the free value"."""

    host_id: str
    region: str
    ready: bool
    gpus: tuple[GpuView, ...]
    free_vcpus: int
    free_memory_mib: int
    total_vcpus: int = 0
    total_memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class HostPlacement:
    """One node of a placement: which GPUs on which host, and the share of each."""

    host_id: str
    gpus: tuple[str, ...]  # GPU UUIDs, never bare indexes
    milli: int = WHOLE  # per GPU; 1000 = whole GPUs


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """Work that holds GPUs now (SCHEDULED .. STOPPING).

    ``vcpus``/``memory_mib`` are per node. ``expected_end`` feeds backfill
    reservations (None = unknown, e.g. an open-ended instance). ``preempting`` marks
    work already under notice (``preempting_for`` = the request it makes room for,
    ``stop_by`` = when the notice runs out) so the core never preempts it twice.
    """

    request_id: str
    tenant_id: str
    placements: tuple[HostPlacement, ...]
    gpu_model: str = ""
    priority: Priority = "standard"
    billing: Billing = "on_demand"
    kind: Kind = "instance"
    started_at: float = 0.0
    expected_end: float | None = None
    restartable: bool = False
    vcpus: int = 0
    memory_mib: int = 0
    preempting: bool = False
    preempting_for: str | None = None
    stop_by: float | None = None
    pinned: bool = False  # bound to its host (a volume lives there): never migrated
    #: saves its progress on a signal (``checkpoint`` at submission): a preemption
    #: loses it no work, and its notice lasts at least ``grace_s`` (time to save).
    #: Only such jobs are time-sliced (a job that restarts from scratch would lose
    #: its run at every slice)
    checkpointable: bool = False
    grace_s: float = 0.0
    #: GPU-seconds this work had received before ``started_at`` (earlier runs of a
    #: requeued job); the time-slice policies add what it received since
    attained_service: float = 0.0
    #: when the work is expected to end by its learned duration
    #: (``PlacementRequest.estimated_duration``), never declared: a time-slice
    #: preemption takes the work expected to run longest first. None: unknown
    estimated_end: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaRule:
    """A limit for one tenant, optionally narrowed to a GPU model and/or a region.

    ``max_gpus`` counts GPUs (fractional shares count as their fraction);
    ``max_instances`` counts running workloads (instances and jobs). Usage is
    derived from ``ClusterSnapshot.allocations`` unless the caller passes
    ``used_gpu_milli`` / ``used_instances`` (e.g. to count STARTING work that holds
    no allocation yet).
    """

    max_gpus: int | None = None
    max_instances: int | None = None
    gpu_model: str | None = None
    region: str | None = None
    used_gpu_milli: int | None = None
    used_instances: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantView:
    tenant_id: str
    weight: float = 1.0
    quotas: tuple[QuotaRule, ...] = ()
    budget_exhausted: bool = False  # billing admits nothing new (no credit, a spent hard-stop budget)
    # why, as billing said it (blockers.billing_blocker): the words of its pending work's reason
    blocker: Blocker | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSnapshot:
    hosts: tuple[HostView, ...]
    allocations: tuple[Allocation, ...] = ()
    tenants: tuple[TenantView, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRequest:
    """A pending instance or job.

    Whole GPUs: ``gpus_per_node >= 1`` and ``gpu_milli == 1000``. A fractional
    share: ``gpus_per_node == 0`` and ``0 < gpu_milli < 1000`` (single node).
    No GPU at all (vCPUs and memory only, e.g. openb's GPU-less pods):
    ``gpus_per_node == 0`` and ``gpu_milli == 0`` (single node).
    ``nodes > 1`` is a multi-host gang, placed all-or-nothing in one region.
    ``expected_duration`` (seconds) feeds backfill and the oracle orders (sjf,
    srtf); ``attained_service`` (GPU-seconds already received, e.g. by a requeued
    job) feeds las and srtf. Both are supplied by the caller.
    ``pinned_host`` (host affinity) places the request on that host or nowhere:
    it waits there, with ``pinned_because`` in its reason, until the host has room.
    ``pool`` confines it to the hosts of a batch pool's members (``BatchPoolFilter``).
    """

    request_id: str
    tenant_id: str
    gpu_model: str
    gpus_per_node: int = 1
    gpu_milli: int = WHOLE
    nodes: int = 1
    vcpus: int = 0
    memory_mib: int = 0
    region: str | None = None
    kind: Kind = "instance"
    priority: Priority = "standard"
    billing: Billing = "on_demand"
    submitted_at: float = 0.0
    expected_duration: float | None = None
    attained_service: float = 0.0
    restartable: bool = False
    #: the job saves its progress when signalled (``checkpoint`` at submission): a
    #: preemption costs it only the work since its last checkpoint, and it resumes
    #: with its attained service kept when requeued; otherwise a preempted
    #: restartable job starts from scratch
    checkpointable: bool = False
    #: host affinity: placed on this host only, or it waits for it (a volume lives there)
    pinned_host: str | None = None
    #: the pinned host's name in words (its id when empty)
    pinned_host_name: str = ""
    #: why, in words for the owner ("where volume data lives"); goes into the wait reason
    pinned_because: str = ""
    #: a batch pool's job (its queue has a pool, Azure Batch's semantics): placed only on the
    #: hosts where the pool's members run (``pool_hosts``, host ids), or it waits for a member
    pool: str = ""
    pool_hosts: frozenset[str] = frozenset()
    #: learned from the tenant's finished work (``scheduler.core.estimate``), never
    #: declared: seconds the request is expected to run. Orders ``gpucloud``'s queue
    #: inside a class and attained-service queue (QSSF); None: no history, age order
    estimated_duration: float | None = None

    @property
    def fractional(self) -> bool:
        return self.gpus_per_node == 0

    @property
    def milli_per_node(self) -> int:
        """GPU demand of one node in milli-GPUs."""
        return self.gpu_milli if self.gpus_per_node == 0 else self.gpus_per_node * WHOLE

    @property
    def total_milli(self) -> int:
        # milli_per_node inlined: read for every request of every cycle
        g = self.gpus_per_node
        return (self.gpu_milli if g == 0 else g * WHOLE) * self.nodes


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Place:
    request_id: str
    placements: tuple[HostPlacement, ...]
    backfilled: bool = False  # started ahead of a blocked head of queue


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop ``victim_id`` after ``notice_s``.

    ``because_request_id`` is the request it makes room for, or None for a reclaim
    of idle GPUs; ``reason`` is user-facing text for the victim's owner: the cause alone,
    the countdown is rendered from the deadline where it is shown (scheduler/notice.py).
    """

    victim_id: str
    because_request_id: str | None
    notice_s: float
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Wait:
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """A suggestion (dynamic mode, restartable work): restart ``request_id`` on
    ``to`` so its current host empties out. Capacity on ``to`` is booked in this
    plan; applying it is optional."""

    request_id: str
    source: tuple[HostPlacement, ...]
    to: tuple[HostPlacement, ...]
    reason: str = ""


Decision: TypeAlias = Place | Preempt | Wait | Reject | Migrate


@dataclass(frozen=True, slots=True)
class PlanCounters:
    placed: int = 0
    backfilled: int = 0
    waiting: int = 0
    rejected: int = 0
    preempted: int = 0
    reclaimed: int = 0
    migrations: int = 0
    placed_gpu_milli: int = 0
    hosts_examined: int = 0  # filter calls' hosts, a cost measure for the benchmark


@dataclass(frozen=True, slots=True)
class Plan:
    """Every queued request gets exactly one Place, Wait or Reject; Preempt and
    Migrate come on top. Order is the order the core decided them in."""

    policy: str
    now: float
    decisions: tuple[Decision, ...]
    counters: PlanCounters = field(default_factory=PlanCounters)

    @property
    def places(self) -> tuple[Place, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Place))

    @property
    def waits(self) -> tuple[Wait, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Wait))

    @property
    def rejects(self) -> tuple[Reject, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Reject))

    @property
    def preempts(self) -> tuple[Preempt, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Preempt))

    @property
    def migrations(self) -> tuple[Migrate, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Migrate))

    def decision_for(self, request_id: str) -> Place | Wait | Reject | None:
        for d in self.decisions:
            if isinstance(d, Place | Wait | Reject) and d.request_id == request_id:
                return d
        return None
