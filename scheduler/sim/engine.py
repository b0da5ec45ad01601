"""The trace-replay engine: an event loop around ``scheduler.core.plan``.

    next event = min(next arrival, next completion, next notice expiry)
    at each event time: arrivals join the queue, completions and expired
    notices give GPUs back (a preempted job is requeued keeping its attained
    service and remaining work), then - if the queue is non-empty and something
    changed - ``plan()`` runs once with the simulated ``now`` and its decisions
    are applied: Place starts a run, Preempt puts a run under notice, Reject
    drops the job, Wait keeps it queued. Migrate suggestions are not applied.

The core gets what the live loop gives it: running allocations (with
``expected_end`` only when the policy may know durations), ``expected_duration``
for the oracle orders only, ``attained_service`` for requeued jobs.

Speed: ``plan()`` rebuilds its working state from the snapshot it is given, so
handing it the whole fleet at every event costs O(hosts) per event (about 12 ms
at 2,800 GPUs). The engine hands it a *view* instead (``_view``): the hosts a
decision can touch - every host with free room (of the fully empty ones only the
lowest ids, as many as the queue could fill, because identical empty hosts tie
on score and the core breaks ties by host id), hosts holding work the queue may
preempt, for backfill the hosts whose work ends soonest, and the largest hosts
the queue's shapes need so "could never fit" stays false. Work on hosts outside
the view is summed per tenant into one allocation with no placement on a view
host, so DRF shares and quota usage stay exact; so is the running work on view
hosts that the core could not read one by one (``_readable``: no queued request may
evict it, it is not under notice, backfill reads no end of it). The capacity denominators of
DRF shares are those of the view (exact for one GPU model, approximate across
models). docs/simulator.md lists what this approximation does and does not keep.
The engine also keeps a ``PlanCache``: host views and allocations are rebuilt only
when they change, so the core reuses its working state for the unchanged ones
(the plan is the same with or without the cache).

The view's "hosts holding work the queue may preempt" come from indexes kept as
runs start, stop, go under notice or change class, not from a walk over the
running work: per class rank the hosts holding victim candidates
(``victim_index``), and under time slicing the hosts holding a candidate that may
be evicted now (``evictable_index``). Evictability (the least quantum served,
under LAS out of the first attained-service queue) only grows with time while a
run stays a candidate, so each candidate waits in a heap (``ripening``) under a
time a little before it may qualify and is tested by the exact rule when popped.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from scheduler.core import (
    CLASS_RANK,
    WHOLE,
    Allocation,
    ClusterSnapshot,
    GpuView,
    HostPlacement,
    HostView,
    Place,
    PlacementRequest,
    Plan,
    PlanCache,
    Policy,
    Preempt,
    Reject,
    TenantView,
    Wait,
    derive_mix,
    derive_workload,
    plan,
)
from scheduler.core.estimate import DurationEstimator
from scheduler.core.framework import PLACEMENTS
from scheduler.core.gcpause import gc_paused
from scheduler.core.planner import ALL_HOSTS, refusal
from scheduler.core.queue import class_first, fair_orders, las_level, las_promote_at, order_key

from .trace import Job, Node

ORACLE_ORDERS = ("sjf", "srtf")
_NOWHERE = "~elsewhere"  # host id of the per-tenant summary allocations
#: fifo without backfill: pass the queue in chunks; the head blocks the rest anyway
FIFO_CHUNK = 32
#: FGD's typical pods: the most popular task shapes that cover 95 % of the tasks
FGD_POPULARITY = 0.95


@dataclass(slots=True)
class RunRow:
    job_id: str
    tenant: str
    submit: float
    start: float
    end: float
    hosts: tuple[str, ...]
    gpus: int  # GPUs on each host (0 for a share)
    milli: int
    preempted: bool


@dataclass(slots=True)
class JobState:
    job: Job
    remaining: float
    attained: float = 0.0  # GPU-seconds
    end: float | None = None
    first_start: float | None = None
    rejected: str = ""
    preemptions: int = 0
    queued_s: float = 0.0
    #: resumes from a checkpoint when preempted; otherwise restarts from scratch
    checkpoint: bool = True
    #: GPU-seconds of progress thrown away by preemptions (restarts from scratch)
    lost: float = 0.0
    #: the milli-GPUs it asks for in all (set by the simulator)
    milli: int = 0
    #: the learned duration its request carries since it last joined the queue
    #: (``Policy.learn_durations``); ``est_asked`` False: not asked yet for this stay
    est: float | None = None
    est_asked: bool = False
    #: the estimate and history length when the job was first asked (for accuracy)
    first_est: float | None = None
    first_history: int = -1


class _Host:
    __slots__ = (
        "host_id",
        "region",
        "model",
        "total",
        "islands",
        "vcpus",
        "mem",
        "whole",
        "milli",
        "free_vcpus",
        "free_mem",
        "nfree",
        "runs",
        "victims",
        "evictable",
        "view",
        "key",
        "uuids",
        "gpu_index",
        "gpu_views",
        "room",
        "tenant",
        "cross_tenant",
    )

    def __init__(self, n: Node) -> None:
        self.host_id = n.node_id
        self.region = n.region
        self.model = n.gpu_model
        self.total = n.num_gpus
        per = max(1, math.ceil(n.num_gpus / max(1, n.nvlink_groups)))
        self.islands = tuple(i // per for i in range(n.num_gpus))
        self.vcpus = n.vcpus
        self.mem = n.memory_mib
        self.whole = [False] * n.num_gpus
        self.milli = [0] * n.num_gpus
        #: whose shares each GPU carries (tenant isolation; None when none or cross_tenant)
        self.tenant: list[str | None] = [None] * n.num_gpus
        self.cross_tenant = n.cross_tenant
        self.free_vcpus = n.vcpus
        self.free_mem = n.memory_mib
        self.nfree = n.num_gpus
        self.runs: dict[str, _Run] = {}
        #: per dynamic class rank, the runs here not under notice (victim candidates)
        self.victims = [0] * len(CLASS_RANK)
        #: per class rank, the candidates among them time slicing lets be evicted now
        self.evictable = [0] * len(CLASS_RANK)
        self.view: HostView | None = None
        self.key = (n.region, n.gpu_model, n.num_gpus)
        self.uuids = tuple(f"{n.node_id}/{i}" for i in range(n.num_gpus))
        #: uuid -> GPU index (what a placement's uuids name)
        self.gpu_index = {u: i for i, u in enumerate(self.uuids)}
        self.gpu_views: dict[tuple[int, bool, int, str | None], GpuView] = {}
        #: the most milli free on one GPU not held whole (kept by Simulator._reindex)
        self.room = WHOLE if n.num_gpus else 0

    def share_room(self) -> int:
        return max(
            (WHOLE - m for m, w in zip(self.milli, self.whole, strict=True) if not w), default=0
        )

    def has_room(self) -> bool:
        if self.nfree:
            return True
        return any(0 < m < WHOLE for m, w in zip(self.milli, self.whole, strict=True) if not w)

    def empty(self) -> bool:
        return self.nfree == self.total and not self.runs

    def gpu_view(self, i: int) -> GpuView:
        """GPU ``i`` as the core sees it. A GPU has only a few states (free, held
        whole, carrying some milli), so the frozen views are made once per state."""
        whole = self.whole[i]
        milli = self.milli[i]
        tenant = self.tenant[i]
        key = (i, whole, milli, tenant)
        g = self.gpu_views.get(key)
        if g is None:
            g = self.gpu_views[key] = GpuView(
                uuid=self.uuids[i],
                index=i,
                model=self.model,
                nvlink_island=self.islands[i],
                numa_node=i // max(1, self.total // 2),
                whole=whole,
                used_milli=0 if whole else milli,
                # busy GPUs compute; nothing in the trace is ever idle-held
                utilisation=1.0 if milli else 0.0,
                share_tenant=tenant,
                cross_tenant=self.cross_tenant,
            )
        return g

    def host_view(self) -> HostView:
        if self.view is None:
            self.view = HostView(
                host_id=self.host_id,
                region=self.region,
                ready=True,
                gpus=tuple([self.gpu_view(i) for i in range(self.total)]),
                free_vcpus=self.free_vcpus,
                free_memory_mib=self.free_mem,
                total_vcpus=self.vcpus,
                total_memory_mib=self.mem,
            )
        return self.view


@dataclass(slots=True)
class _Run:
    js: JobState
    start: float
    placements: tuple[HostPlacement, ...]
    alloc: Allocation
    milli: int
    model: str
    priority: str
    preempting: bool = False
    version: int = 0
    #: the rank of its class when that class's mode is dynamic, else -1
    drank: int = -1
    #: when it started among all runs (a tenant's runs are kept in this order)
    seq: int = 0
    #: time slicing: counted in ``_Host.evictable``; ``token`` names its entry in
    #: ``Simulator.ripening`` (0: none)
    evictable: bool = False
    token: int = 0
    #: the number ``Simulator.usage_index`` gives its (tenant, model) (set by ``_start``)
    usage_key: int = 0
    #: it asks for vCPUs or memory (set by ``_start``)
    asks_res: bool = False


@dataclass
class Result:
    jobs: dict[str, JobState]
    runs: list[RunRow]
    capacity_milli: int
    alloc_area: float  # milli-GPU-seconds allocated while work waited or ran
    active_time: float
    tenant_alloc: dict[str, float]
    tenant_fair: dict[str, float]
    preemptions: int
    plan_calls: int
    wall_s: float
    series: list[tuple[float, int, float, dict[str, float]]] = field(default_factory=list)
    demand_marks: dict[str, float] = field(default_factory=dict)
    view_rejects: int = 0
    skipped: int = 0
    lost_gpu_s: float = 0.0
    preempted_gpu_s: float = 0.0
    #: per tenant, the integral of its max-min (water-filled) fair share of the
    #: capacity given every tenant's demand (GPUs of its queued and running jobs)
    tenant_maxmin: dict[str, float] = field(default_factory=dict)
    #: the policy learned durations (``Policy.learn_durations``)
    learned: bool = False


#: a queued request's shape: region, model, gpus_per_node, gpu_milli, nodes,
#: class rank, asks vCPUs, asks memory
_Shape = tuple[str | None, str, int, int, int, int, bool, bool]


def _maxmin(demand: dict[str, float], weights: dict[str, float], cap: float) -> dict[str, float]:
    """Weighted max-min fair shares of ``cap`` (water-filling): no tenant gets more
    than it asks, and what one cannot use goes to the others by weight."""
    out: dict[str, float] = {}
    left = float(cap)
    weight = weights.get
    wsum = sum(weight(t, 1.0) for t in demand)
    # by demand per weight, then name (names are unique: the rest is never compared)
    for _r, t, d, w in sorted([(d / weight(t, 1.0), t, d, weight(t, 1.0)) for t, d in demand.items()]):
        give = min(d, left * w / wsum) if wsum > 0 else 0.0
        out[t] = give
        left -= give
        wsum -= w
    return out


#: a queued job's place in its group: the core's order key, then the job id
_Key = tuple[tuple[object, ...], str]


def _unsort(lst: list[_Key], key: _Key) -> None:
    i = bisect.bisect_left(lst, key)
    assert lst[i] == key
    del lst[i]


class _Agg:
    """What the view needs to know of the queue: shapes, not requests."""

    __slots__ = (
        "models", "need", "min_g", "frac", "min_rank", "min_frac", "min_milli", "cpu", "mem",
        "cpu_only",
    )

    def __init__(self) -> None:
        self.models: dict[tuple[str | None, str], int] = defaultdict(int)
        self.need: dict[tuple[str, str | None, int], int] = {}
        self.min_g: float = math.inf
        self.frac = False
        self.min_rank = 3
        self.min_frac = WHOLE + 1  # the smallest fractional share queued
        self.min_milli = 0  # the smallest GPU demand of one request (milli)
        self.cpu = False
        self.mem = False
        #: (region, model) of queued work without GPUs (it may go on any host)
        self.cpu_only: set[tuple[str | None, str]] = set()

    def add(
        self, region: str | None, model: str, g: int, milli: int, nodes: int, rank: int,
        cpu: bool, mem: bool, count: int,
    ) -> None:
        self.models[(region, model)] += nodes * count
        if g == 0 and milli == 0:
            self.cpu_only.add((region, model))
        key = (model, region, max(g, 1))
        if self.need.get(key, 0) < nodes:
            self.need[key] = nodes
        if g == 0:
            self.frac = True
            if milli < self.min_frac:
                self.min_frac = milli
        elif g < self.min_g:
            self.min_g = g
        m = (milli if g == 0 else g * WHOLE) * nodes
        if self.min_milli == 0 or m < self.min_milli:
            self.min_milli = m
        if rank < self.min_rank:
            self.min_rank = rank
        self.cpu = self.cpu or cpu
        self.mem = self.mem or mem


class _WholeFleet:
    """The whole simulated fleet as the core's ``refusal`` reads it (``FleetLimits``):
    the core plans over a view of it, and a job is refused only if no host of the
    fleet could ever hold it. Fixed for the replay."""

    __slots__ = ("max_gpus", "max_vcpus", "max_mem", "_sizes", "_hosts_with")

    def __init__(
        self, by_size: dict[tuple[str, str | None], list[_Host]], max_vcpus: int, max_mem: int
    ) -> None:
        #: (model, region or None) -> GPUs per host, largest first
        self._sizes = {key: [h.total for h in hosts] for key, hosts in by_size.items() if hosts}
        self.max_gpus = {key: sizes[0] for key, sizes in self._sizes.items()}
        self.max_vcpus = max_vcpus
        self.max_mem = max_mem
        self._hosts_with: dict[tuple[str, str | None, int], int] = {}

    def hosts_with(self, model: str, region: str | None, c: int) -> int:
        key = (model, region, c)
        n = self._hosts_with.get(key)
        if n is None:
            n = self._hosts_with[key] = sum(1 for s in self._sizes.get((model, region), ()) if s >= c)
        return n


class Simulator:
    """One replay. ``guarantees`` (tenant -> GPUs) turns on lending: work inside a
    tenant's guarantee runs as ``standard``, work beyond it borrows idle capacity
    as ``low``/spot and is preempted (with notice) when an owner needs it back."""

    def __init__(
        self,
        nodes: Sequence[Node],
        jobs: Sequence[Job],
        policy: Policy,
        *,
        oracle: bool | None = None,
        guarantees: dict[str, float] | None = None,
        weights: dict[str, float] | None = None,
        series_points: int = 0,
        demand_marks: Sequence[float] = (),
        drop_unplaced: bool | None = None,
        checkpoint_fraction: float = 1.0,
        incremental: bool = True,
    ) -> None:
        self.policy = policy
        self.checkpoint_fraction = checkpoint_fraction
        #: hand the core only what its depth cap lets it look at (same plan)
        self.incremental = incremental and policy.max_waits is not None
        self.oracle = policy.queue_order in ORACLE_ORDERS if oracle is None else oracle
        self.hosts = {n.node_id: _Host(n) for n in nodes}
        if len(self.hosts) != len(nodes):
            raise ValueError("duplicate node ids in the cluster")
        self.default_model = nodes[0].gpu_model if nodes else ""
        self.capacity = sum(h.total for h in self.hosts.values()) * WHOLE
        self.guarantee_milli = {t: g * WHOLE for t, g in (guarantees or {}).items()}
        self.weights = dict(weights or {})
        if self.guarantee_milli:
            for t, g in self.guarantee_milli.items():
                self.weights.setdefault(t, max(g / WHOLE, 1e-3))
        self.jobs = sorted(jobs, key=lambda j: (j.submit, j.job_id))
        for j in self.jobs:
            if not j.gpu_model:
                j.gpu_model = self.default_model
        # the trace's task shapes: its fragmentation mix, and FGD's target workload
        shapes = [
            PlacementRequest(request_id="", tenant_id="", gpu_model="", gpus_per_node=j.gpus_per_node,
                             gpu_milli=j.gpu_milli, vcpus=j.vcpus)
            for j in self.jobs
        ]
        gpu_shapes = [r for r in shapes if r.gpus_per_node or r.gpu_milli]
        if not policy.mix and gpu_shapes:
            self.policy = policy.with_(mix=derive_mix(gpu_shapes))  # the mix counts GPU shapes only
        spec = PLACEMENTS[self.policy.placement]
        if spec.uses_workload and not self.policy.workload and shapes:
            # FGD's "typical pods": the most popular shapes covering 95 % of the tasks
            self.policy = self.policy.with_(workload=derive_workload(shapes, FGD_POPULARITY))
        self.hosts_to_score = (
            ALL_HOSTS
            if spec.gradient
            else max(1, self.policy.k if self.policy.k is not None else spec.k)
        )
        #: the least GPU demand of any job (milli): lending classes stop looking at a
        #: tenant's queue once its guarantee has less than this left
        self.least_milli = min(
            (
                j.gpu_milli * j.nodes if j.gpus_per_node == 0 else j.gpus_per_node * WHOLE * j.nodes
                for j in self.jobs
            ),
            default=0,
        )
        #: some job asks for vCPUs or memory (the per-tenant summaries carry GPUs only)
        self.res_jobs = any(j.vcpus or j.memory_mib for j in self.jobs)
        self.series_points = series_points
        self.demand_marks = sorted(demand_marks)
        self.drop_unplaced = (
            all(math.isinf(j.duration) for j in self.jobs)
            if drop_unplaced is None
            else drop_unplaced
        )
        if self.drop_unplaced and self.policy.max_waits is not None:
            # a request that does not fit when it arrives is dropped: look at all
            self.policy = self.policy.with_(max_waits=None)
            self.incremental = False
        self.chunked = (
            self.policy.queue_order == "fifo"
            and self.policy.head_of_line
            and not self.policy.backfill
            and len({j.gpu_model for j in self.jobs}) <= 1
        )
        self.may_preempt = self.policy.preemption and self.policy.mode != "static"
        #: srtf's order and time slicing: the queue's first key is the shortest
        #: remaining time, which bounds what any queued request may evict
        self.srtf = self.policy.queue_order == "srtf" and self.policy.time_slice == "srtf"
        #: class -> rank for the classes whose running work may be preempted
        self.dynamic = {
            c: r for c, r in CLASS_RANK.items() if self.policy.mode_for(c) == "dynamic"
        }
        if self.policy.reclaim:
            # every simulated GPU computes (utilisation 1.0, never idle), so a
            # reclaim never fires: skip its pass over the running work
            self.policy = self.policy.with_(reclaim=False)
        # Running work the core can never touch: no class is dynamic (so nothing is
        # a victim, reclaimed or migrated, and nothing is ever under notice) and no
        # end times are known (backfill finds no end). Then the core reads running
        # allocations only for dominant shares, and those only order tenants
        # sharing a class lane of a fair order (see _shares_matter).
        self.opaque = not self.oracle and not any(
            self.policy.mode_for(c) == "dynamic" for c in CLASS_RANK
        )
        #: durations learned from the jobs finished so far (issue 33); fed in _stop,
        #: read when a request is built, so an estimate rests only on jobs that ended
        #: before the decision (the trace has no members or names: tenant and GPUs)
        self.estimator = DurationEstimator() if self.policy.learn_durations else None

    # ------------------------------------------------------------------ fleet facts

    def _fleet_index(self) -> None:
        self.empty: dict[tuple[str, str, int], list[str]] = defaultdict(list)
        # (region, model) -> hosts with free room that are not empty
        self.partial: dict[tuple[str, str], set[str]] = defaultdict(set)
        # (model, region or None) -> hosts, largest first
        self.by_size: dict[tuple[str, str | None], list[_Host]] = defaultdict(list)
        for h in sorted(self.hosts.values(), key=lambda h: h.host_id):
            self.empty[h.key].append(h.host_id)
            self.by_size[(h.model, h.region)].append(h)
            self.by_size[(h.model, None)].append(h)
        for lst in self.by_size.values():
            lst.sort(key=lambda h: (-h.total, h.host_id))
        self.max_vcpus = max((h.vcpus for h in self.hosts.values()), default=0)
        self.max_mem = max((h.mem for h in self.hosts.values()), default=0)
        self.big_cpu = max(self.hosts.values(), key=lambda h: (h.vcpus, h.host_id)).host_id
        self.big_mem = max(self.hosts.values(), key=lambda h: (h.mem, h.host_id)).host_id
        self.whole_fleet = _WholeFleet(self.by_size, self.max_vcpus, self.max_mem)

    def _refusal(self, j: Job) -> str:
        """The core's rule for "reject outright" (``refusal``), asked against the
        whole fleet when the job arrives: the view the core plans over is smaller."""
        req = PlacementRequest(
            request_id=j.job_id,
            tenant_id=j.tenant,
            gpu_model=j.gpu_model,
            gpus_per_node=j.gpus_per_node,
            gpu_milli=j.gpu_milli,
            nodes=j.nodes,
            region=j.region,
            vcpus=j.vcpus,
            memory_mib=j.memory_mib,
        )
        return refusal(req, self.whole_fleet)

    def _reindex(self, h: _Host) -> None:
        h.view = None
        was_empty = h.host_id in self._empty_set
        part = self.partial[(h.region, h.model)]
        if h.empty():
            part.discard(h.host_id)
            if not was_empty:
                bisect.insort(self.empty[h.key], h.host_id)
                self._empty_set.add(h.host_id)
                busy = self.busy
                del busy[bisect.bisect_left(busy, h.host_id)]
            return
        if was_empty:
            lst = self.empty[h.key]
            del lst[bisect.bisect_left(lst, h.host_id)]
            self._empty_set.discard(h.host_id)
            bisect.insort(self.busy, h.host_id)
        h.room = h.share_room()
        if h.has_room():
            part.add(h.host_id)
        else:
            part.discard(h.host_id)

    # ------------------------------------------------------------------ the loop

    def run(self) -> Result:
        # The replay keeps every job, run and row alive until the end and makes no
        # reference cycles: no cyclic GC meanwhile (about a tenth of the run time),
        # and what it made is handed over unscanned.
        with gc_paused(promote=True):
            return self._run()

    def _run(self) -> Result:
        t_wall = time.perf_counter()
        self._fleet_index()
        # host views are rebuilt only when a host changes, so the core may keep
        # their working state between plan() calls
        self.cache = PlanCache()
        self._summaries: dict[tuple[str, str, int], Allocation] = {}
        self._tenant_views = tuple(
            TenantView(tenant_id=tn, weight=w) for tn, w in sorted(self.weights.items())
        )
        self._empty_set = {hid for lst in self.empty.values() for hid in lst}
        #: the hosts that are not empty, in id order (the core's tie-break order)
        self.busy: list[str] = []
        #: per dynamic class rank, the hosts holding victim candidates of that rank
        #: (``_Host.victims`` non-zero), in id order: ``_victim_hosts`` walks these
        #: instead of every busy host
        self.victim_index: list[list[str]] = [[] for _ in CLASS_RANK]
        #: the same for the candidates time slicing lets be evicted now
        #: (``_Host.evictable``), and the candidates not yet so, by about when
        self.evictable_index: list[list[str]] = [[] for _ in CLASS_RANK]
        self.ripening: list[tuple[float, int, _Run]] = []
        self.token_seq = 0
        self.least_quantum = min(
            [self.policy.min_run_s, *(q for _c, q in self.policy.slice_quantum)]
        )
        self.las_th0 = self.policy.las_thresholds[0] if self.policy.las_thresholds else 0.0
        self.state: dict[str, JobState] = {}
        self.queue: dict[str, JobState] = {}
        # the incremental queue: per group (a tenant for fair orders, else one
        # group) the queued jobs sorted by the core's order key
        self.grouped = fair_orders(self.policy)
        self.ordered: dict[str, list[_Key]] = {}
        #: queued job -> its group, its key in that group's order and its shape
        self.queue_position: dict[str, tuple[str, _Key, _Shape]] = {}
        self.key_dirty: set[str] = set()
        #: per tenant, its queued jobs in submit order (lending's classes)
        self.tenant_queue: dict[str, list[tuple[float, str]]] = {}
        self.promotions: list[tuple[float, str]] = []
        #: queued request shapes -> count (what the view needs of the whole queue)
        self.shapes: dict[_Shape, int] = {}
        self.lost_gpu_s = 0.0
        self.preempted_gpu_s = 0.0
        self.requests: dict[str, PlacementRequest] = {}
        self.running: dict[str, _Run] = {}
        self.tenant_runs: dict[str, dict[str, _Run]] = defaultdict(dict)
        #: lending: per tenant, its running jobs not classed low
        self.nonlow_runs: dict[str, set[str]] = defaultdict(set)
        #: lending: per tenant, where ``_classes`` left its walk over the runs:
        #: the guarantee used, the run it stopped at (-1: none) and the last run seen
        self.classed: dict[str, tuple[int, int, int]] = {}
        self.run_seq = 0
        self.usage_milli: dict[tuple[str, str], int] = defaultdict(int)  # (tenant, model) -> milli
        #: (tenant, model) -> a number of its own, once it ran (``_allocations`` sums by it)
        self.usage_index: dict[tuple[str, str], int] = {}
        self.tenant_used: dict[str, int] = defaultdict(int)
        self.demand: dict[str, int] = defaultdict(int)  # tenant -> queued + running jobs
        #: bumped whenever a tenant's ``demand`` comes or goes (by _count_demand)
        self.demand_version = 0
        self.rows: list[RunRow] = []
        self.events: list[tuple[float, int, str, str, int]] = []
        self.event_seq = 0
        self.used_milli = 0
        self.preemptions = 0
        #: request -> its victims still under notice; (time, request) once the last stopped
        self.notices: dict[str, int] = {}
        self.notice_ended: list[tuple[float, str]] = []
        self.plan_calls = 0
        self.view_rejects = 0
        self.dirty_tenants: set[str] = set()
        #: with lending, the class each queued job runs as (standard inside its tenant's guarantee)
        self._lent_class: dict[str, str] = {}
        #: lending: per tenant, its queued jobs classed standard
        self.std_queued: dict[str, set[str]] = defaultdict(set)
        self.rank_runs: dict[int, int] = defaultdict(int)
        alloc_area = 0.0
        active_time = 0.0
        t_alloc: dict[str, float] = defaultdict(float)
        t_fair: dict[str, float] = defaultdict(float)
        t_maxmin: dict[str, float] = defaultdict(float)
        self.tenant_demand_milli: dict[str, float] = {}
        series: list[tuple[float, int, float, dict[str, float]]] = []
        marks = list(self.demand_marks)
        mark_out: dict[str, float] = {}
        by_pct: dict[int, list[float]] = {}
        arrived = 0.0
        skipped = 0
        jobs = self.jobs
        horizon = (jobs[-1].submit - jobs[0].submit) if jobs else 0.0
        step = horizon / self.series_points if self.series_points and horizon > 0 else math.inf
        next_sample = jobs[0].submit if jobs else 0.0
        ai = 0
        last = jobs[0].submit if jobs else 0.0
        cap = self.capacity
        dirty = False
        demand_seen = -1
        fair_rate: list[tuple[str, float]] = []
        maxmin: list[tuple[str, float]] = []
        maxmin_of: tuple[tuple[str, float], ...] | None = None
        while ai < len(jobs) or self.events:
            t = jobs[ai].submit if ai < len(jobs) else math.inf
            if self.events and self.events[0][0] < t:
                t = self.events[0][0]
            # ---- integrate metrics over [last, t)
            dt = t - last
            if dt > 0 and (self.queue or self.running):
                alloc_area += self.used_milli * dt
                active_time += dt
                if demand_seen != self.demand_version:
                    # the tenants with demand and their fair rates change only when
                    # a tenant's demand comes or goes (_count_demand)
                    demand_seen = self.demand_version
                    active = [tn for tn, c in self.demand.items() if c > 0]
                    wsum = sum(self.weights.get(tn, 1.0) for tn in active)
                    fair_rate = [(tn, cap * self.weights.get(tn, 1.0) / wsum) for tn in active]
                # max-min shares only with the demand (a requeue takes some and gives it back)
                asked = tuple(self.tenant_demand_milli.items())
                if asked != maxmin_of:
                    maxmin_of = asked
                    maxmin = list(_maxmin(self.tenant_demand_milli, self.weights, cap).items())
                used_of = self.tenant_used.get
                for tn, rate in fair_rate:
                    t_alloc[tn] += used_of(tn, 0) * dt
                    t_fair[tn] += rate * dt
                for tn, f in maxmin:
                    t_maxmin[tn] += f * dt
            last = t
            if t >= next_sample:
                series.append(
                    (
                        t,
                        len(self.queue),
                        self.used_milli / cap if cap else 0.0,
                        {tn: u / cap for tn, u in self.tenant_used.items() if u},
                    )
                )
                next_sample = t + step
            # ---- events at t
            arrived_now = ai < len(jobs) and jobs[ai].submit == t
            while ai < len(jobs) and jobs[ai].submit == t:
                j = jobs[ai]
                ai += 1
                js = JobState(j, j.duration, checkpoint=self._checkpoints(j.job_id))
                js.milli = (
                    j.gpu_milli * j.nodes if j.gpus_per_node == 0 else j.gpus_per_node * WHOLE * j.nodes
                )
                self.state[j.job_id] = js
                arrived += j.gpus * WHOLE
                why = self._refusal(j)
                if why:
                    js.rejected = why
                    skipped += 1
                    continue
                self._enqueue(js)
                dirty = True
            while self.events and self.events[0][0] == t:
                _t, _s, kind, jid, ver = heapq.heappop(self.events)
                r = self.running.get(jid)
                if r is None or r.version != ver:
                    continue
                self._stop(r, t, preempted=kind == "stop")
                dirty = True
            if dirty and self.queue:
                dirty = self._schedule(t)
            elif not self.queue:
                dirty = False
            if arrived_now and cap:
                # FGD's reading: the allocation after each arrival, grouped by the
                # arrived demand in whole per cent of capacity
                pct = round(100 * arrived / cap)
                acc = by_pct.setdefault(pct, [0.0, 0])
                acc[0] += self.used_milli / cap
                acc[1] += 1
            while marks and arrived >= marks[0] * cap - 1e-6:
                mark_out[f"{marks[0]:g}"] = self.used_milli / cap
                marks.pop(0)
        for m in self.demand_marks:
            # as FGD's analysis reads its log: the mean allocation over the arrivals
            # whose demand rounds to the mark (else to the mark +- 1 %); a mark never
            # reached that way keeps the allocation when the demand crossed it
            p = round(100 * m)
            got = by_pct.get(p)
            if got is None:
                near = [by_pct[q] for q in (p - 1, p, p + 1) if q in by_pct]
                if near:
                    got = [sum(a[0] for a in near), sum(int(a[1]) for a in near)]
            if got is not None and got[1]:
                mark_out[f"{m:g}"] = got[0] / got[1]
        # whatever could never start (no departures, or blocked forever)
        for js in self.queue.values():
            js.rejected = js.rejected or "never placed"
        return Result(
            jobs=self.state,
            runs=self.rows,
            capacity_milli=cap,
            alloc_area=alloc_area,
            active_time=active_time,
            tenant_alloc=dict(t_alloc),
            tenant_fair=dict(t_fair),
            tenant_maxmin=dict(t_maxmin),
            preemptions=self.preemptions,
            plan_calls=self.plan_calls,
            wall_s=time.perf_counter() - t_wall,
            series=series,
            demand_marks=mark_out,
            view_rejects=self.view_rejects,
            skipped=skipped,
            lost_gpu_s=self.lost_gpu_s,
            preempted_gpu_s=self.preempted_gpu_s,
            learned=self.estimator is not None,
        )

    # ------------------------------------------------------------------ queue

    def _count_demand(self, j: Job, sign: int) -> None:
        """After ``demand[j.tenant]`` moved by ``sign``: its GPUs too."""
        if self.demand[j.tenant] == (1 if sign > 0 else 0):
            self.demand_version += 1  # the tenant's demand came or went
        d = self.tenant_demand_milli.get(j.tenant, 0.0) + sign * j.gpus * WHOLE
        if d > 1e-6:
            self.tenant_demand_milli[j.tenant] = d
        else:
            self.tenant_demand_milli.pop(j.tenant, None)

    def _checkpoints(self, job_id: str) -> bool:
        """A deterministic ``checkpoint_fraction`` of the jobs checkpoint."""
        f = self.checkpoint_fraction
        if f >= 1.0:
            return True
        if f <= 0.0:
            return False
        return zlib.crc32(job_id.encode()) % 100_000 < f * 100_000

    def _enqueue(self, js: JobState) -> None:
        j = js.job
        js.est_asked = False  # asked again when its request is next built
        self.queue[j.job_id] = js
        self.demand[j.tenant] += 1
        self._count_demand(j, 1)
        self.requests.pop(j.job_id, None)
        self.dirty_tenants.add(j.tenant)
        self.key_dirty.add(j.job_id)
        tq = self.tenant_queue.get(j.tenant)
        if tq is None:
            tq = self.tenant_queue[j.tenant] = []
        bisect.insort(tq, (j.submit, j.job_id))

    def _dequeue(self, jid: str) -> JobState | None:
        js = self.queue.pop(jid, None)
        if js is None:
            return None
        tq = self.tenant_queue[js.job.tenant]
        del tq[bisect.bisect_left(tq, (js.job.submit, jid))]
        if self._lent_class.pop(jid, None) == "standard":
            self.std_queued[js.job.tenant].discard(jid)
        old = self.queue_position.pop(jid, None)
        if old is not None:
            _unsort(self.ordered[old[0]], old[1])
            self._count(old[2], -1)
        self.key_dirty.discard(jid)
        return js

    def _count(self, shape: _Shape, d: int) -> None:
        c = self.shapes[shape] = self.shapes.get(shape, 0) + d
        if c == 0:
            del self.shapes[shape]

    def _rekey(self, now: float) -> None:
        """Bring the incremental queue up to date: requests that joined, changed
        class or were promoted by the starvation guard get their order key again."""
        p = self.policy
        promote = self.policy.queue_order in ("las", "gpucloud")
        while self.promotions and self.promotions[0][0] <= now:
            _t, jid = heapq.heappop(self.promotions)
            if jid in self.queue:
                self.key_dirty.add(jid)
        if not self.key_dirty:
            return
        grouped = self.grouped
        for jid in sorted(self.key_dirty):
            js = self.queue.get(jid)
            if js is None:
                continue
            req = self._request(js, self._lent_class.get(jid, "low") if self.guarantee_milli else js.job.priority)
            key: _Key = (order_key(p, req, now), jid)
            group = req.tenant_id if grouped else ""
            shape: _Shape = (
                req.region,
                req.gpu_model,
                req.gpus_per_node,
                req.gpu_milli,
                req.nodes,
                CLASS_RANK.get(req.priority, 1),
                req.vcpus > 0,
                req.memory_mib > 0,
            )
            old = self.queue_position.get(jid)
            if old is not None:
                if old[1] == key and old[2] == shape:
                    continue
                _unsort(self.ordered[old[0]], old[1])
                self._count(old[2], -1)
            lst = self.ordered.get(group)
            if lst is None:
                lst = self.ordered[group] = []
            bisect.insort(lst, key)
            self.queue_position[jid] = (group, key, shape)
            self._count(shape, 1)
            if promote and req.attained_service > 0 and las_level(p, req, now) > 0:
                t = las_promote_at(p, req)
                if t > now:
                    heapq.heappush(self.promotions, (t, jid))
        self.key_dirty.clear()

    def _request(self, js: JobState, priority: str) -> PlacementRequest:
        j = js.job
        r = self.requests.get(j.job_id)
        if r is None or r.priority != priority:
            r = self.requests[j.job_id] = PlacementRequest(
                request_id=j.job_id,
                tenant_id=j.tenant,
                gpu_model=j.gpu_model,
                gpus_per_node=j.gpus_per_node,
                gpu_milli=j.gpu_milli,
                nodes=j.nodes,
                region=j.region,
                vcpus=j.vcpus,
                memory_mib=j.memory_mib,
                kind="job",
                priority=priority,  # type: ignore[arg-type]
                billing="spot" if priority == "low" and self.guarantee_milli else j.billing,  # type: ignore[arg-type]
                submitted_at=j.submit,
                # the core's remaining time is expected_duration - attained per GPU
                expected_duration=(
                    js.remaining + js.attained / max(j.gpus, 1e-3) if self.oracle else None
                ),
                estimated_duration=self._estimate(js) if self.estimator is not None else None,
                attained_service=js.attained,
                restartable=True,
                checkpointable=js.checkpoint,
            )
        return r

    def _estimate(self, js: JobState) -> float | None:
        """The learned duration for this stay in the queue: asked once, when the
        request is first built after the job joined, from the jobs finished by then."""
        if not js.est_asked:
            est = cast(DurationEstimator, self.estimator)
            j = js.job
            got = est.estimate(tenant=j.tenant, gpus=j.gpus)
            js.est = None if got is None else got.seconds
            js.est_asked = True
            if js.first_history < 0:
                js.first_est = js.est
                js.first_history = est.history(tenant=j.tenant, gpus=j.gpus)
        return js.est

    def _classes(self) -> dict[str, str]:
        """Lending: each tenant's oldest running work up to its guarantee is
        ``standard``, the rest borrows as ``low``; queued work is ``standard``
        while it fits in what the guarantee leaves."""
        out: dict[str, str] = {}
        least = self.least_milli
        for tn in self.dirty_tenants:
            g = self.guarantee_milli.get(tn, 0)
            runs = self.tenant_runs.get(tn, {})
            nonlow = self.nonlow_runs[tn]
            # The walk below is a fixed point: walked again over the same runs it
            # changes nothing (a class depends on the runs before it and their
            # sizes, never on a run's class now; work under notice keeps its class
            # until it stops). So it resumes where it ended, over the runs started
            # since; a stop (``_stop``) makes it start again from the oldest run.
            done = self.classed.get(tn)
            if done is None:
                cum, rest_from, after = 0, -1, -1
                todo: Iterable[tuple[str, _Run]] = runs.items()
            else:
                cum, rest_from, after = done
                started: list[tuple[str, _Run]] = []
                for item in reversed(runs.items()):
                    if item[1].seq <= after:
                        break
                    started.append(item)
                started.reverse()
                todo = started
            if rest_from < 0:
                for jid, r in todo:
                    if g - cum < least:
                        # every run asks for at least ``least``: the rest borrow
                        rest_from = r.seq
                        break
                    cls = "standard" if cum + r.milli <= g else "low"
                    if cls == "standard":
                        cum += r.milli
                    if cls != r.priority and not r.preempting:
                        self._reclass(jid, r, cls, nonlow)
            if rest_from >= 0 and nonlow:
                # of the rest (runs are in start order), only those not low yet change
                # (of the runs walked before, none is left but work under notice)
                since = max(rest_from, after + 1)
                for jid in [jid for jid in nonlow if runs[jid].seq >= since]:
                    r = runs[jid]
                    if not r.preempting:
                        self._reclass(jid, r, "low", nonlow)
            self.classed[tn] = (cum, rest_from, self.run_seq)
            queue = self.queue
            tq = self.tenant_queue.get(tn, ())
            stop = len(tq)
            for i, (_s, jid) in enumerate(tq):
                if g - cum < least:
                    # no job of the trace fits in what is left: the rest borrow
                    stop = i
                    break
                m = queue[jid].milli
                if cum + m <= g:
                    cum += m
                    out[jid] = "standard"
                else:
                    out[jid] = "low"
            std = self.std_queued.get(tn)
            if std and stop < len(tq):
                # of the rest, only the ones classed standard until now change
                first = tq[stop]
                for jid in std:
                    if (queue[jid].job.submit, jid) >= first:
                        out[jid] = "low"
        return out

    def _reclass(self, jid: str, r: _Run, cls: str, nonlow: set[str]) -> None:
        """Lending: running work ``r`` runs as ``cls`` from now on."""
        self.rank_runs[CLASS_RANK[r.priority]] -= 1
        self.rank_runs[CLASS_RANK[cls]] += 1
        self._count_victim(r, -1)
        r.priority = cls
        r.drank = self.dynamic.get(cls, -1)
        self._count_victim(r, 1)
        r.alloc = replace(
            r.alloc,
            priority=cls,  # type: ignore[arg-type]
            billing="spot" if cls == "low" else "on_demand",
        )
        if cls == "low":
            nonlow.discard(jid)
        else:
            nonlow.add(jid)

    # ------------------------------------------------------------------ planning

    def _schedule(self, now: float) -> bool:
        """One scheduling point. Returns whether the next event must plan again
        even if nothing else changes (never: plan() is deterministic)."""
        if self.guarantee_milli:
            classes = self._classes()
            for jid, cls in classes.items():
                if self._lent_class.get(jid) != cls:
                    self._lent_class[jid] = cls
                    self.key_dirty.add(jid)
                    std = self.std_queued[self.queue[jid].job.tenant]
                    if cls == "standard":
                        std.add(jid)
                    else:
                        std.discard(jid)
        self.dirty_tenants.clear()
        self._rekey(now)
        cls_of = self._lent_class.get if self.guarantee_milli else None
        if self.notice_ended:
            self._plan_notice_ended(now, cls_of)
        if self.chunked:
            # fifo without backfill: the age order, in chunks; the head blocks the rest
            order = self.ordered.get("", [])
            i = 0
            n = len(order)
            queue = self.queue
            position = self.queue_position
            while i < n:
                ids = [jid for _k, jid in order[i : i + FIFO_CHUNK]]
                chunk = [self._request(queue[jid], self._prio(jid, cls_of)) for jid in ids]
                # the chunk's shapes as _rekey counted them (the same requests)
                counts: dict[_Shape, int] = {}
                for jid in ids:
                    shape = position[jid][2]
                    counts[shape] = counts.get(shape, 0) + 1
                agg = _Agg()
                for shape, c in counts.items():
                    agg.add(*shape, c)
                placed, waited = self._plan_once(chunk, now, agg)
                if waited or not placed:
                    break
                i += FIFO_CHUNK
                order = self.ordered.get("", [])  # placed jobs left it
                i -= placed
                n = len(order)
            return False
        agg = self._aggregate_queue()
        if self.incremental:
            reqs = self._heads(now, agg, cls_of)
        else:
            reqs = [self._request(js, self._prio(jid, cls_of)) for jid, js in self.queue.items()]
        self._plan_once(reqs, now, agg)
        return False

    def _plan_notice_ended(self, now: float, cls_of: object) -> None:
        """The GPUs a notice freed go first to the request it was given for, when
        the order may hand them to lower-class work before it: plan such requests
        alone before the queue. Otherwise the lower-class work (the victim itself,
        requeued, when the order ignores class) takes them and the request preempts
        it again at once (by class there is no quantum): without checkpoints, for
        ever."""
        first = sorted(
            {
                jid
                for t, jid in self.notice_ended
                if t == now and jid in self.queue and self._lower_class_ahead(jid, cls_of)
            }
        )
        self.notice_ended.clear()
        if first:
            reqs = [self._request(self.queue[jid], self._prio(jid, cls_of)) for jid in first]
            self._plan_once(reqs, now, None)

    def _lower_class_ahead(self, jid: str, cls_of: object) -> bool:
        """Whether the core's order may decide a request of a lower class than
        queued ``jid`` before it: one ahead of it in its group or, for a fair
        order, one in another group. Never when the order starts with the class."""
        if class_first(self.policy):
            return False
        rank = CLASS_RANK.get(self._prio(jid, cls_of), 1)
        group, key, _shape = self.queue_position[jid]
        for g, lst in self.ordered.items():
            ahead = lst[: bisect.bisect_left(lst, key)] if g == group else lst
            if any(CLASS_RANK.get(self._prio(other, cls_of), 1) > rank for _k, other in ahead):
                return True
        return False

    def _prio(self, jid: str, cls_of: object) -> str:
        if cls_of is None:
            return self.queue[jid].job.priority
        return self._lent_class.get(jid, "low")

    def _heads(self, now: float, agg: _Agg, cls_of: object) -> list[PlacementRequest]:
        """What the core can look at under its depth cap: per group, the first
        ``max_waits`` requests plus as many as the free capacity could place. The
        core's order inside a group is the group's order, and it stops after
        ``max_waits`` misses, so it never pops a request left out here."""
        cap = self.policy.max_waits
        assert cap is not None
        free = self.capacity - self.used_milli
        smallest = agg.min_milli if agg.min_milli > 0 else WHOLE
        n = cap + free // smallest + 1
        out = []
        queue = self.queue
        requests = self.requests
        lent = self._lent_class if cls_of is not None else None
        for lst in self.ordered.values():
            for _k, jid in lst[:n]:
                # _request(queue[jid], _prio(jid, cls_of)), inlined for its usual hit
                prio = lent.get(jid, "low") if lent is not None else queue[jid].job.priority
                r = requests.get(jid)
                if r is None or r.priority != prio:
                    r = self._request(queue[jid], prio)
                out.append(r)
        return out

    def _aggregate_queue(self) -> _Agg:
        agg = _Agg()
        for (region, model, g, milli, nodes, rank, cpu, mem), c in self.shapes.items():
            agg.add(region, model, g, milli, nodes, rank, cpu, mem, c)
        return agg

    def _plan_once(
        self, reqs: list[PlacementRequest], now: float, agg: _Agg | None
    ) -> tuple[int, int]:
        if agg is None:
            agg = _Agg()
            for r in reqs:
                agg.add(
                    r.region, r.gpu_model, r.gpus_per_node, r.gpu_milli, r.nodes,
                    CLASS_RANK.get(r.priority, 1), r.vcpus > 0, r.memory_mib > 0, 1,
                )
        view = self._view(reqs, agg, now)
        if view is None:
            return 0, len(reqs)
        snap = view
        self.plan_calls += 1
        result: Plan = plan(snap, reqs, self.policy, now=now, cache=self.cache)
        return self._apply(result, now)

    def _view(self, reqs: list[PlacementRequest], agg: _Agg, now: float) -> ClusterSnapshot | None:
        hosts = self.hosts
        ids: set[str] = set()
        models = agg.models
        need = agg.need
        min_g = agg.min_g
        frac = agg.frac
        min_rank = agg.min_rank
        cpu_only = agg.cpu_only
        for key, lst in self.empty.items():
            n = models.get((key[0], key[1]), 0) + models.get((None, key[1]), 0)
            if n and lst:
                ids.update(lst[: n + self.hosts_to_score + 1])
        # partly used hosts that could hold the smallest queued request
        min_m = agg.min_frac
        for (region, model), part in self.partial.items():
            if part and ((region, model) in models or (None, model) in models):
                for hid in part:
                    h = hosts[hid]
                    if h.nfree >= min_g or (frac and h.room >= min_m):
                        ids.add(hid)
        victims = self._victim_hosts(min_rank, need, now)
        # work without GPUs may go on any host with vCPUs and memory left
        if cpu_only:
            for h in hosts.values():
                if (h.region, h.model) in cpu_only or (None, h.model) in cpu_only:
                    ids.add(h.host_id)
        # nothing could start and nothing could be preempted: plan() would only wait
        if not victims and not frac:
            best = max((hosts[h].nfree for h in ids), default=0)
            if best < min_g:
                return None
        ids |= victims
        if self.policy.backfill and self.oracle and self.running:
            ends: dict[str, float] = {}
            for run in self.running.values():
                e = run.alloc.stop_by if run.preempting else run.alloc.expected_end
                if e is None:
                    continue
                for p in run.placements:
                    if e < ends.get(p.host_id, math.inf):
                        ends[p.host_id] = e
            b = 2 * max(need.values(), default=1) + 8
            ids.update(heapq.nsmallest(b, ends, key=lambda h: (ends[h], h)))
        # the largest hosts each queued shape needs, so the core's "never fits" agrees
        for (model, region, g), nodes in need.items():
            got = 0
            for h in self.by_size.get((model, region), ()):
                if h.total < g:
                    break
                ids.add(h.host_id)
                got += 1
                if got >= nodes:
                    break
        if agg.cpu:
            ids.add(self.big_cpu)
        if agg.mem:
            ids.add(self.big_mem)
        if victims and not frac and self.srtf and self._srtf_idle(ids, min_g, min_rank, now):
            return None
        hv = tuple([hosts[h].view or hosts[h].host_view() for h in sorted(ids)])
        if self.opaque and not self._shares_matter(reqs):
            # the core would read no allocation: hand it none (same plan, and the
            # per-call cost no longer grows with the running work)
            return ClusterSnapshot(hosts=hv, allocations=(), tenants=self._tenant_views)
        return ClusterSnapshot(
            hosts=hv,
            allocations=self._allocations(ids, reqs, min_rank, now),
            tenants=self._tenant_views,
        )

    def _allocations(
        self, ids: set[str], reqs: list[PlacementRequest], min_rank: int, now: float
    ) -> tuple[Allocation, ...]:
        """The allocations touching the view, the rest summed per tenant."""
        hosts = self.hosts
        # of the allocations on view hosts only the work the core could read one by one (a victim, work
        # under notice, backfill's ends); the rest joins its tenant's summary
        readable = self._readable(min_rank, now)
        allocs: dict[str, Allocation] = {}
        # milli read one by one, by usage_index's number of (tenant, model)
        seen = [0] * len(self.usage_index)
        if readable is None:
            for hid in ids:
                for jid, run in hosts[hid].runs.items():
                    if jid not in allocs:
                        allocs[jid] = run.alloc
                        seen[run.usage_key] += run.milli
        else:
            above, inside = readable
            res = self.res_jobs
            # a candidate time slicing lets be evicted now (``_Run.evictable``, which
            # never turns true early) is inside under LAS: inside's bounds are wider
            las = self.policy.time_slice == "las"
            for hid in ids:
                for jid, run in hosts[hid].runs.items():
                    r = run.drank
                    if (
                        (
                            r > above
                            or run.preempting
                            or (r == min_rank and inside is not None and ((las and run.evictable) or inside(run)))
                            or (res and run.asks_res)
                        )
                        # (a gang's run is met on each of its hosts: taken once)
                        and jid not in allocs
                    ):
                        allocs[jid] = run.alloc
                        seen[run.usage_key] += run.milli
        rest = []
        summaries = self._summaries
        # only tenants in the queue: the core reads no other tenant's share (no
        # quotas here, and a summary is never a victim nor reclaimed)
        queued = {r.tenant_id for r in reqs}
        for (tn, model), milli in self.usage_milli.items():
            if tn not in queued:
                continue
            left = milli - seen[self.usage_index[(tn, model)]]
            if left > 0:
                # the same object while the sum stays, so the core's cache reuses it
                key = (tn, model, left)
                a = summaries.get(key)
                if a is None:
                    if len(summaries) > 4096:
                        summaries.clear()
                    a = summaries[key] = Allocation(
                        request_id=f"{_NOWHERE}/{tn}/{model}",
                        tenant_id=tn,
                        placements=(HostPlacement(_NOWHERE, (_NOWHERE,), left),),
                        gpu_model=model,
                        priority="critical",  # never a victim: it stands for many
                    )
                rest.append(a)
        return (*allocs.values(), *rest)

    def _victim_hosts(
        self, min_rank: int, need: dict[tuple[str, str | None, int], int], now: float
    ) -> set[str]:
        """Hosts holding work the queue could preempt, in the core's host order, a
        bounded prefix: the lowest host ids holding such work. A host holds such
        work if it runs a victim candidate of a class ranked below ``min_rank``
        (``victim_index``) or, under time slicing, one of ``min_rank`` itself that
        may be evicted now (``evictable_index``, kept up to date by
        ``_ripen``). The hosts are walked in id order through these indexes and
        the walk stops at the bound: no running job is tested here.
        (tests/simulator/test_h7_indexes.py checks it against a walk that tests
        every busy host's runs.)"""
        victims: set[str] = set()
        ts = self.policy.time_slice
        if self.may_preempt and any(
            c for rk, c in self.rank_runs.items() if rk > min_rank or (ts and rk == min_rank)
        ):
            want = 2 * (self.policy.preempt_candidates + max(need.values(), default=1))
            lists = [lst for lst in self.victim_index[max(min_rank + 1, 0) :] if lst]
            if ts and 0 <= min_rank < len(self.victim_index):
                self._ripen(now)
                if self.evictable_index[min_rank]:
                    lists.append(self.evictable_index[min_rank])
            if not lists:
                return victims
            # the lowest ``want`` ids of the union: each list is sorted and holds an id
            # once, so they are among the lowest ``want`` of each list
            if len(lists) == 1:
                victims.update(lists[0][:want])
            else:
                victims.update(sorted(set().union(*[lst[:want] for lst in lists]))[:want])
        return victims

    def _evictable(self, run: _Run, now: float) -> bool:
        """Whether time slicing lets a victim candidate of its own class be evicted
        at ``now`` (relaxed: any quantum counts as served): it has run the least
        quantum and, under LAS, left the first attained-service queue. Once true it
        stays true while the run stays a candidate (both sides only grow with now)."""
        if run.start > now - self.least_quantum:
            return False
        return not (
            self.policy.time_slice == "las"
            and run.js.attained + (now - run.start) * run.milli / WHOLE < self.las_th0
        )

    def _ripen(self, now: float) -> None:
        """Move the victim candidates that became evictable by ``now`` into
        ``evictable_index``. Each candidate waits in ``ripening`` under a time a
        little before it may become evictable; the exact test is ``_evictable``."""
        heap = self.ripening
        later = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            run = entry[2]
            if run.token != entry[1]:
                continue  # no longer a candidate (stopped, under notice, reclassed)
            if self._evictable(run, now):
                run.evictable = True
                self._count_evictable(run, 1)
            else:
                later.append(entry)
        for _t, token, run in later:
            heapq.heappush(heap, (now, token, run))

    def _ripe_at(self, run: _Run) -> float:
        """About when ``_evictable`` turns true for a new candidate (inf: never)."""
        if not run.js.checkpoint:
            return math.inf
        t = run.start + self.least_quantum
        if self.policy.time_slice == "las":
            short = self.las_th0 - run.js.attained
            if short > 0:
                if run.milli <= 0:
                    return math.inf
                t = max(t, run.start + short * WHOLE / run.milli)
        return t

    def _count_evictable(self, run: _Run, d: int) -> None:
        self._count_on_hosts(run, d, evictable=True)

    def _count_on_hosts(self, run: _Run, d: int, *, evictable: bool) -> None:
        """Count ``run`` in (d=1) or out of (d=-1) its hosts' per-rank counts of
        victim candidates (or of evictable ones), keeping the index of the hosts
        whose count for its rank is not zero."""
        hosts = self.hosts
        rank = run.drank
        index = (self.evictable_index if evictable else self.victim_index)[rank]
        for p in run.placements:
            h = hosts[p.host_id]
            counts = h.evictable if evictable else h.victims
            c = counts[rank] = counts[rank] + d
            if c == 0:
                del index[bisect.bisect_left(index, p.host_id)]
            elif c == d:  # was 0
                bisect.insort(index, p.host_id)

    def _readable(
        self, min_rank: int, now: float
    ) -> tuple[int, Callable[[_Run], bool] | None] | None:
        """Which running work on view hosts the core must get as its own
        allocation (None: all of it). The core reads a running allocation one by
        one only as a possible victim (``can_evict``), as work under notice, for
        backfill's end times, for migration, and for dominant shares; the shares
        need only the tenant's sums, which the summary allocations keep exact for
        work without vCPUs or memory. So the rest is summed: work of a class no
        queued request may preempt, or inside the class work that ``can_evict``
        (relaxed as in ``_view``: any quantum, the first attained-service queue,
        the shortest remaining time queued) refuses now.

        Answers (above, inside): work under notice, work with vCPUs or memory and
        work of a dynamic class ranked above ``above`` is read; of the class
        ``min_rank`` itself the work ``inside`` answers true for (None: none)."""
        policy = self.policy
        if policy.defrag or policy.reclaim or (policy.backfill and self.oracle):
            return None
        if not self.may_preempt:
            return len(CLASS_RANK), None
        ts = policy.time_slice
        if not ts:
            return min_rank, None
        las = ts == "las"
        srtf = self.srtf
        # each bound is widened by a second (or GPU-second): handing the core work it
        # then refuses changes nothing, while a rounding the other way would hide a victim
        started_by = now - min([policy.min_run_s, *(q for _c, q in policy.slice_quantum)]) + 1.0
        th0 = (policy.las_thresholds[0] if policy.las_thresholds else 0.0) - 1.0
        shortest = math.inf
        if srtf:
            # the order key of srtf starts with the remaining time (queue.order_key)
            shortest = min(
                (cast(float, lst[0][0][0]) for lst in self.ordered.values() if lst),
                default=math.inf,
            ) - 1.0

        def inside(run: _Run) -> bool:
            if run.start > started_by or not run.js.checkpoint:
                return False
            if las:
                return run.js.attained + (now - run.start) * run.milli / WHOLE >= th0
            if srtf:
                end = run.alloc.expected_end
                return end is not None and end - now > shortest
            return True

        return min_rank, inside

    def _srtf_idle(self, ids: set[str], min_g: float, min_rank: int, now: float) -> bool:
        """Under srtf, whether ``plan()`` over these view hosts could only wait:
        nothing fits on them, and nothing running on them is of a lower dynamic
        class or expected to run longer than the shortest remaining time queued
        (``can_evict``, relaxed: any quantum counts as served). Most events under
        srtf are such, and the plan is then skipped like any other that could
        only wait."""
        hosts = self.hosts
        if max(hosts[h].nfree for h in ids) >= min_g:
            return False
        # the order key of srtf starts with the remaining time (queue.order_key)
        shortest = min(
            (cast(float, lst[0][0][0]) for lst in self.ordered.values() if lst), default=math.inf
        )
        for hid in ids:
            for run in hosts[hid].runs.values():
                if run.preempting:
                    continue
                rank = run.drank
                if rank > min_rank:
                    return False
                if rank == min_rank and run.js.checkpoint:
                    end = run.alloc.expected_end
                    if end is not None and end - now > shortest:
                        return False
        return True

    def _shares_matter(self, reqs: list[PlacementRequest]) -> bool:
        """Whether the core's order reads tenant shares for this queue: only fair
        orders do, and only to order two tenants queued in one lane (a class for
        ``gpucloud``, the whole queue for ``drf``)."""
        order = self.policy.queue_order
        if order not in ("gpucloud", "drf"):
            return False
        lanes: dict[int, str] = {}
        for r in reqs:
            lane = CLASS_RANK.get(r.priority, 1) if order == "gpucloud" else 0
            t = lanes.setdefault(lane, r.tenant_id)
            if t != r.tenant_id:
                return True
        return False

    def _apply(self, result: Plan, now: float) -> tuple[int, int]:
        placed = waited = 0
        for d in result.decisions:
            if isinstance(d, Place):
                js = self._dequeue(d.request_id)
                assert js is not None
                self._start(js, d.placements, now)
                placed += 1
            elif isinstance(d, Preempt):
                r = self.running.get(d.victim_id)
                if r is None or r.preempting:
                    continue
                self._count_victim(r, -1)
                r.preempting = True
                stop_by = now + d.notice_s
                r.alloc = replace(
                    r.alloc, preempting=True, preempting_for=d.because_request_id, stop_by=stop_by
                )
                if stop_by < r.start + r.js.remaining:
                    self._push(stop_by, "stop", d.victim_id, r.version)
                rid = d.because_request_id
                self.notices[rid] = self.notices.get(rid, 0) + 1
            elif isinstance(d, Reject):
                js = self.queue.get(d.request_id)
                if js is None:
                    continue
                # admission ran against the whole fleet, so this is the view's doing
                self.view_rejects += 1
                waited += 1
            elif isinstance(d, Wait):
                waited += 1
                if self.drop_unplaced:
                    # nothing ever ends, so what does not fit now never will
                    js = self._dequeue(d.request_id)
                    if js is not None:
                        js.rejected = "did not fit when it arrived"
                        self.demand[js.job.tenant] -= 1
                        self._count_demand(js.job, -1)
        return placed, waited

    # ------------------------------------------------------------------ runs

    def _count_victim(self, run: _Run, d: int) -> None:
        """Keep each host's count of victim candidates by class (``_Host.victims``)."""
        if run.drank < 0 or run.preempting:
            return
        self._count_on_hosts(run, d, evictable=False)
        if not self.policy.time_slice:
            return
        if d > 0:
            self.token_seq += 1
            run.token = self.token_seq
            t = self._ripe_at(run)
            if t < math.inf:
                # a margin before the estimate: _ripen tests the exact rule
                heapq.heappush(self.ripening, (t - 2.0, run.token, run))
        else:
            run.token = 0
            if run.evictable:
                run.evictable = False
                self._count_evictable(run, -1)

    def _push(self, t: float, kind: str, jid: str, ver: int) -> None:
        self.event_seq += 1
        heapq.heappush(self.events, (t, self.event_seq, kind, jid, ver))

    def _start(self, js: JobState, placements: tuple[HostPlacement, ...], now: float) -> None:
        j = js.job
        milli = 0
        for p in placements:
            h = self.hosts[p.host_id]
            for u in p.gpus:
                i = h.gpu_index[u]
                if p.milli >= WHOLE:
                    assert not h.whole[i] and h.milli[i] == 0, f"{u} booked twice"
                    h.whole[i] = True
                    h.milli[i] = WHOLE
                    h.nfree -= 1
                else:
                    if h.milli[i] == 0:
                        h.nfree -= 1
                    h.milli[i] += p.milli
                    assert h.milli[i] <= WHOLE, f"{u} over 1000 milli"
                    if not h.cross_tenant:
                        assert h.tenant[i] in (None, j.tenant), f"{u} shared by two tenants"
                        h.tenant[i] = j.tenant
                milli += p.milli
            h.free_vcpus -= j.vcpus
            h.free_mem -= j.memory_mib
        if js.first_start is None:
            js.first_start = now
        prio = self.requests[j.job_id].priority if j.job_id in self.requests else j.priority
        alloc = Allocation(
            request_id=j.job_id,
            tenant_id=j.tenant,
            placements=placements,
            gpu_model=j.gpu_model,
            priority=prio,
            billing=self.requests[j.job_id].billing if j.job_id in self.requests else j.billing,  # type: ignore[arg-type]
            kind="job",
            started_at=now,
            expected_end=(now + js.remaining) if self.oracle else None,
            # the learned duration less the service it had before this run
            estimated_end=(
                now + js.est - js.attained / max(j.gpus, 1e-3)
                if self.estimator is not None and js.est is not None
                else None
            ),
            restartable=True,
            vcpus=j.vcpus,
            memory_mib=j.memory_mib,
            attained_service=js.attained,
            checkpointable=js.checkpoint,
        )
        run = _Run(js, now, placements, alloc, milli, j.gpu_model, prio)
        run.drank = self.dynamic.get(prio, -1)
        key = (j.tenant, j.gpu_model)
        got = self.usage_index.get(key)
        if got is None:
            got = self.usage_index[key] = len(self.usage_index)
        run.usage_key = got
        run.asks_res = bool(j.vcpus or j.memory_mib)
        for p in placements:
            h = self.hosts[p.host_id]
            h.runs[j.job_id] = run
            self._reindex(h)
        self._count_victim(run, 1)
        old = self.running.get(j.job_id)
        run.version = (old.version + 1) if old else self.event_seq
        self.running[j.job_id] = run
        self.rank_runs[CLASS_RANK.get(prio, 1)] += 1
        self.tenant_runs[j.tenant][j.job_id] = run
        self.run_seq += 1
        run.seq = self.run_seq
        if prio != "low":
            self.nonlow_runs[j.tenant].add(j.job_id)
        self.usage_milli[(j.tenant, j.gpu_model)] += milli
        self.tenant_used[j.tenant] += milli
        self.used_milli += milli
        self.dirty_tenants.add(j.tenant)
        if not math.isinf(js.remaining):
            self._push(now + js.remaining, "end", j.job_id, run.version)

    def _stop(self, run: _Run, now: float, *, preempted: bool) -> None:
        js = run.js
        j = js.job
        if run.preempting:
            rid = cast(str, run.alloc.preempting_for)
            self.notices[rid] -= 1
            if not self.notices[rid]:
                del self.notices[rid]
                self.notice_ended.append((now, rid))
        del self.running[j.job_id]
        self._count_victim(run, -1)
        self.rank_runs[CLASS_RANK.get(run.priority, 1)] -= 1
        del self.tenant_runs[j.tenant][j.job_id]
        self.nonlow_runs[j.tenant].discard(j.job_id)
        self.classed.pop(j.tenant, None)
        for p in run.placements:
            h = self.hosts[p.host_id]
            for u in p.gpus:
                i = h.gpu_index[u]
                if p.milli >= WHOLE:
                    h.whole[i] = False
                    h.milli[i] = 0
                    h.nfree += 1
                else:
                    h.milli[i] -= p.milli
                    if h.milli[i] == 0:
                        h.nfree += 1
                        h.tenant[i] = None
            h.free_vcpus += j.vcpus
            h.free_mem += j.memory_mib
            del h.runs[j.job_id]
            self._reindex(h)
        self.usage_milli[(j.tenant, run.model)] -= run.milli
        self.tenant_used[j.tenant] -= run.milli
        self.used_milli -= run.milli
        self.dirty_tenants.add(j.tenant)
        ran = now - run.start
        first = run.placements[0]
        self.rows.append(
            RunRow(
                j.job_id,
                j.tenant,
                j.submit,
                run.start,
                now,
                tuple(p.host_id for p in run.placements),
                len(first.gpus) if first.milli >= WHOLE else 0,
                first.milli,
                preempted,
            )
        )
        if preempted:
            self.preemptions += 1
            js.preemptions += 1
            gpu_s = ran * run.milli / WHOLE
            js.attained += gpu_s
            self.preempted_gpu_s += gpu_s
            if js.checkpoint:
                js.remaining = max(0.0, js.remaining - ran)
            else:
                # no checkpoint: the progress of this run is lost, it starts over
                js.lost += (j.duration - js.remaining + ran) * run.milli / WHOLE
                self.lost_gpu_s += (j.duration - js.remaining + ran) * run.milli / WHOLE
                js.remaining = j.duration
            self.demand[j.tenant] -= 1
            self._count_demand(j, -1)
            self._enqueue(js)
        else:
            js.end = now
            if self.estimator is not None:
                self.estimator.observe(tenant=j.tenant, gpus=j.gpus, seconds=j.duration)
            self.demand[j.tenant] -= 1
            self._count_demand(j, -1)
