"""``CycleState``: the one state every stage of a ``plan()`` call reads and changes.

Built once per call from the snapshot, the queue, the policy and the clock; the
stages (admission, placement, preemption, backfill, dynamic) are functions over it.
It holds no logic beyond the choice of the filters the candidate loop runs and the
head-of-line question both admission and placement ask.
"""

from __future__ import annotations

from collections import Counter

from .. import plugins as _plugins  # noqa: F401  (registers the built-in plugins)
from ..framework import FILTERS, PLACEMENTS, SCORES, CycleContext, Filter, Score
from ..model import CLASS_RANK, ClusterSnapshot, Decision, PlacementRequest, TenantView
from ..plugins import FgdGradientScore, FgdModel, ResourcesFilter, fgd_model, frag_model
from ..policy import Policy
from ..queue import ShareBook
from ..quota import QuotaBook
from ..state import AllocState, Fleet, HostState, PlanCache, Pool
from .workload import derive_mix, derive_workload

#: "every feasible host" for gradient placements (the scan limit still bounds it)
ALL_HOSTS = 1 << 30

#: the filters every policy runs, in this order; the policy may add more
BASE_FILTERS = ("ready", "gpu-model", "region", "gpus", "resources")

#: a request's size per resource, for the "at least as large" memos: GPUs per node
#: (or milli of a share), nodes, vCPUs, memory MiB, expected duration (INF if unknown)
Shape = tuple[int, int, int, int, float]
#: a shape plus the requester's time-slice key (``time_slice_key``): what a victim search depends on
VictimShape = tuple[int, int, int, int, float, float]


class NoRoom:
    """Why a request found no room: filter failures by name, hosts examined."""

    __slots__ = ("fails", "examined")

    def __init__(self, fails: Counter[str], examined: int) -> None:
        self.fails = fails
        self.examined = examined


class CycleState:
    """What one cycle knows and has decided so far.

    Capacity consumed by a placement is booked on ``fleet`` at once, so a later
    request of the same cycle never sees it free (STYLE 14). The memos
    (``failed_shapes``, ``no_victims``, ``victim_hosts``) lean on that: within a
    cycle capacity and victims only ever get fewer.
    """

    __slots__ = (
        "policy",
        "now",
        "requests",
        "placement_spec",
        "hosts_to_score",
        "mix",
        "workload",
        "fleet",
        "fragmentation",
        "require_island",
        "filters",
        "hot_filters",
        "hot_filters_one_gpu",
        "hot_filters_multi_gpu",
        "resources_filter_only",
        "any_reserved",
        "any_pooled",
        "scores",
        "fgd",
        "tenants",
        "shares",
        "quota",
        "decisions",
        "counts",
        "failed_shapes",
        "blocked",
        "reserved_start",
        "waiting_ahead",
        "waiting_milli",
        "under_notice",
        "pool_cache",
        "no_victims",
        "victim_hosts",
        "time_slice_keys",
        "service_queues",
        "slice_keys",
        "dynamic",
        "slice_quantum",
    )

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        requests: list[PlacementRequest],
        policy: Policy,
        now: float,
        cache: PlanCache | None = None,
    ) -> None:
        self.policy = policy
        self.now = now
        self.requests = requests
        spec = self.placement_spec = PLACEMENTS[policy.placement]
        #: how many feasible hosts the walk collects for scoring (kube's
        #: percentageOfNodesToScore); gradient placements rank every feasible host
        self.hosts_to_score = (
            ALL_HOSTS if spec.gradient else max(1, policy.k if policy.k is not None else spec.k)
        )
        self.mix = policy.mix or derive_mix(requests)
        self.workload = (policy.workload or derive_workload(requests)) if spec.uses_workload else ()
        if cache is not None:
            # cached score totals are only valid for the same plugins and mix
            key: tuple[object, ...] = (spec, self.mix)
            if spec.uses_workload:
                key = (spec, self.mix, self.workload)
            if cache.key != key:
                cache.clear()
                cache.key = key
        self.fleet = Fleet(snapshot, now, cache)
        self.fragmentation = frag_model(self.mix)
        self.require_island = policy.topology == "require"
        context = CycleContext(
            now=now, mix=self.mix, workload=self.workload, require_island=self.require_island
        )
        names = list(BASE_FILTERS)
        if self.require_island:
            names.append("nvlink")
        names.append("reservation")
        names.append("batch-pool")
        names.extend(policy.extra_filters)
        self.filters: list[Filter] = [FILTERS[n](context) for n in names]
        self.hot_filters: list[Filter] = []
        self.hot_filters_one_gpu: list[Filter] = []
        self.hot_filters_multi_gpu: list[Filter] = []
        self.resources_filter_only = False
        #: some host is reserved this cycle: only then does the walk run ReservationFilter
        self.any_reserved = False
        #: some request belongs to a batch pool: only then does the walk run BatchPoolFilter
        self.any_pooled = any(r.pool for r in requests)
        self.choose_hot_filters()
        self.scores: list[Score] = [SCORES[n](context, w) for n, w in spec.scores]
        self.fgd: FgdModel | None = fgd_model(self.workload) if spec.uses_workload else None
        if spec.gradient:
            assert self.fgd is not None
            self.scores = [FgdGradientScore(self.fgd)]
        self.tenants: dict[str, TenantView] = {t.tenant_id: t for t in snapshot.tenants}
        self.shares = ShareBook(self.fleet, snapshot)
        self.quota = QuotaBook(self.fleet, snapshot)
        self.decisions: list[Decision] = []
        #: placed, waiting, preempted, ... : the plan's counters by name
        self.counts = Counter[str]()
        #: (model, region, tenant of a share, excluded regions) -> the minimal shapes
        #: that found no room, with why (a larger shape finds none either)
        self.failed_shapes: dict[tuple[object, ...], list[tuple[Shape, NoRoom]]] = {}
        #: (gpu model, region or None) -> first blocked request id. Keyed by region
        #: too: a head pinned to one region must not block work pinned elsewhere.
        self.blocked: dict[tuple[str, str | None], str] = {}
        #: gpu model -> the start backfill reserved for its blocked head
        self.reserved_start: dict[str, float] = {}
        #: gpu model -> requests already waiting for capacity ("N requests ahead of you")
        self.waiting_ahead: dict[str, int] = {}
        #: gpu model -> milli-GPUs waiting for capacity (what reclaim may free)
        self.waiting_milli: dict[str, int] = {}
        #: request id -> running work already under notice to make room for it
        self.under_notice: dict[str, list[AllocState]] = {}
        for st in self.fleet.allocs.values():
            preempting_for = st.alloc.preempting_for
            if st.alloc.preempting and preempting_for is not None:
                self.under_notice.setdefault(preempting_for, []).append(st)
        #: (model, region, excluded regions) -> the pools a request may use
        self.pool_cache: dict[tuple[str, str | None, tuple[str, ...]], list[Pool]] = {}
        #: shape and time-slice key -> "" (no victims at all: any larger shape, or one
        #: with a later slice key, has none either) or the cap's words (refused by the
        #: cap: only this very shape and key, a larger one may fit the cap)
        self.no_victims: dict[tuple[object, ...], list[tuple[VictimShape, str]]] = {}
        #: (pool, class rank) -> hosts that still hold work that class could preempt
        self.victim_hosts: dict[tuple[str, str, int, float], dict[HostState, None]] = {}
        #: request id -> its time-slice key (preemption.time_slice_key)
        self.time_slice_keys: dict[str, float] = {}
        #: request id of running work -> its attained-service queue now
        self.service_queues: dict[str, int] = {}
        #: running work -> its side of the time-slice test (preemption.slice_key)
        self.slice_keys: dict[AllocState, float] = {}
        # the policy's figures by class: read only, so a cache keeps them for the
        # same policy object
        memo = cache.policy_memo if cache is not None else None
        #: class -> whether its running work may be preempted (its mode is dynamic)
        self.dynamic: dict[str, bool]
        self.slice_quantum: dict[str, float]
        if memo is not None and memo[0] is policy:
            _policy, self.dynamic, self.slice_quantum = memo
        else:
            self.dynamic = {c: policy.mode_for(c) == "dynamic" for c in CLASS_RANK}
            self.slice_quantum = dict(policy.slice_quantum)
            if cache is not None:
                cache.policy_memo = (policy, self.dynamic, self.slice_quantum)

    def choose_hot_filters(self) -> None:
        """The filters the candidate loop runs. Besides ``indexed`` filters it
        leaves out what the walk guarantees for whole-GPU requests (``gpus``: the
        bucket has >= g free), ``nvlink`` for single GPUs, ``reservation``
        until some host is reserved and ``batch-pool`` without a pool's request;
        each saves a call per host examined."""
        self.hot_filters = [
            f
            for f in self.filters
            if not f.indexed
            and (f.name != "reservation" or self.any_reserved)
            and (f.name != "batch-pool" or self.any_pooled)
        ]
        self.hot_filters_multi_gpu = [f for f in self.hot_filters if f.name != "gpus"]
        self.hot_filters_one_gpu = [f for f in self.hot_filters_multi_gpu if f.name != "nvlink"]
        # the usual single-GPU case runs the resources filter alone: the candidate
        # loop then does its two comparisons inline instead of a call per host
        self.resources_filter_only = (
            len(self.hot_filters_one_gpu) == 1
            and type(self.hot_filters_one_gpu[0]) is ResourcesFilter
        )

    def is_blocked(self, req: PlacementRequest) -> bool:
        """Is an earlier request for this model blocked where ``req`` could go?"""
        blocked = self.blocked
        return (req.gpu_model, req.region) in blocked or (req.gpu_model, None) in blocked
