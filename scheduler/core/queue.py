"""Queue orders. ``make_order`` returns an object the planner pops requests from
and tells what happened, so orders that depend on decisions (weighted DRF) stay
incremental: a heap of tenants per class keyed by (dominant share / weight, age
of the tenant's oldest request, tenant id), lazily refreshed when a tenant's
share changes. Pop and update are O(log tenants), never a re-sort.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable

from .estimate import learned_service
from .model import CLASS_RANK, WHOLE, ClusterSnapshot, PlacementRequest
from .policy import QUEUE_ORDERS, Policy
from .state import Fleet

_AGE = operator.attrgetter("submitted_at", "request_id")


def _learned_age(r: PlacementRequest) -> tuple[float, float, str]:
    """Inside one lane of ``gpucloud``: expected service left (QSSF), then age. Without
    estimates every request keys 0.0 and this is the age order."""
    return (learned_service(r), r.submitted_at, r.request_id)


class ShareBook:
    """Per-tenant usage and weighted dominant-resource share.

    Resources are the GPUs of each model (milli), vCPUs and memory; capacity is
    the ready fleet. share = max(used_r / capacity_r) / weight.

    The running work is summed by ``load()``, which the fair orders call: the
    static orders read no share, and the sum costs a pass over every allocation
    of the cycle.
    """

    def __init__(self, fleet: Fleet, snapshot: ClusterSnapshot) -> None:
        self.fleet = fleet
        self.weight: dict[str, float] = {t.tenant_id: max(t.weight, 1e-9) for t in snapshot.tenants}
        self.gpu: dict[str, dict[str, int]] = {}
        self.cpu: dict[str, int] = {}
        self.mem: dict[str, int] = {}
        self.share_of: dict[str, float] = {}
        self.raw: dict[str, float] = {}  # unweighted dominant share
        self.inv_cap = {m: 1.0 / c for m, c in fleet.cap_milli.items() if c}
        self.inv_cpu = 1.0 / fleet.cap_vcpus if fleet.cap_vcpus else 0.0
        self.inv_mem = 1.0 / fleet.cap_mem if fleet.cap_mem else 0.0
        self.loaded = False

    def load(self) -> None:
        """Sum the running work per tenant first and take each share once: usage
        only grows, so this equals adding the allocations one by one. Once."""
        if self.loaded:
            return
        self.loaded = True
        fleet = self.fleet
        gpu, cpu, mem = self.gpu, self.cpu, self.mem
        for st in fleet.allocs.values():
            a = st.alloc
            model = a.gpu_model or fleet.model_of(a)
            tenant = a.tenant_id
            g = gpu.get(tenant)
            if g is None:
                g = gpu[tenant] = {}
                cpu[tenant] = mem[tenant] = 0
            g[model] = g.get(model, 0) + st.milli
            # per node, on every node (most work asks for GPUs alone)
            if a.vcpus:
                cpu[tenant] += a.vcpus * len(a.placements)
            if a.memory_mib:
                mem[tenant] += a.memory_mib * len(a.placements)
        inv_cap = self.inv_cap
        for tenant, g in gpu.items():
            s = max(cpu[tenant] * self.inv_cpu, mem[tenant] * self.inv_mem, 0.0)
            for model, used in g.items():
                x = used * inv_cap.get(model, 0.0)
                if x > s:
                    s = x
            self.raw[tenant] = s
            self.share_of[tenant] = s / self.weight.get(tenant, 1.0)

    def _add(self, tenant: str, model: str, milli: int, vcpus: int, mem: int) -> None:
        # usage only grows within a cycle, so the dominant share is a running max
        g = self.gpu.get(tenant)
        if g is None:
            g = self.gpu[tenant] = {}
        used = g[model] = g.get(model, 0) + milli
        cpu = self.cpu[tenant] = self.cpu.get(tenant, 0) + vcpus
        mem_used = self.mem[tenant] = self.mem.get(tenant, 0) + mem
        s = max(
            self.raw.get(tenant, 0.0),
            used * self.inv_cap.get(model, 0.0),
            cpu * self.inv_cpu,
            mem_used * self.inv_mem,
        )
        self.raw[tenant] = s
        self.share_of[tenant] = s / self.weight.get(tenant, 1.0)

    def share(self, tenant: str) -> float:
        return self.share_of.get(tenant, 0.0)

    def charge(self, req: PlacementRequest) -> None:
        # _add() written out: this runs once per placement
        n = req.nodes
        g = req.gpus_per_node
        tenant = req.tenant_id
        model = req.gpu_model
        gpu = self.gpu.get(tenant)
        if gpu is None:
            gpu = self.gpu[tenant] = {}
        used = gpu[model] = gpu.get(model, 0) + (g * WHOLE if g else req.gpu_milli) * n
        cpu = self.cpu[tenant] = self.cpu.get(tenant, 0) + req.vcpus * n
        mem = self.mem[tenant] = self.mem.get(tenant, 0) + req.memory_mib * n
        s = self.raw.get(tenant, 0.0)
        x = used * self.inv_cap.get(model, 0.0)
        if x > s:
            s = x
        x = cpu * self.inv_cpu
        if x > s:
            s = x
        x = mem * self.inv_mem
        if x > s:
            s = x
        self.raw[tenant] = s
        self.share_of[tenant] = s / self.weight.get(tenant, 1.0)


class Order:
    """Static orders: one sort up front."""

    def __init__(self, reqs: list[PlacementRequest]) -> None:
        self._reqs = reqs
        self._i = 0

    def pop(self) -> PlacementRequest | None:
        if self._i >= len(self._reqs):
            return None
        r = self._reqs[self._i]
        self._i += 1
        return r

    def done(self, req: PlacementRequest, placed: bool) -> None:
        """Called after each decision; static orders ignore it."""


class _Lane:
    """One lane of a ``FairOrder``: each tenant's requests by age, and a heap of
    the tenants keyed by (share, age of the oldest, tenant, version)."""

    __slots__ = ("heap", "queues")

    def __init__(self) -> None:
        self.heap: list[tuple[float, float, str, int]] = []
        self.queues: dict[str, deque[PlacementRequest]] = {}


class FairOrder(Order):
    """Class, then (for ``gpucloud``) attained-service queue, then weighted
    dominant share (live), then age. ``lane`` gives each request its lane; lanes
    are served in order, tenants inside a lane by share."""

    def __init__(
        self,
        reqs: Iterable[PlacementRequest],
        book: ShareBook,
        lane: Callable[[PlacementRequest], tuple[int, ...]] | None,
        within: Callable[[PlacementRequest], tuple[object, ...]] = _AGE,
    ) -> None:
        """``lane`` None: one lane for all. ``within``: a tenant's order inside a lane."""
        super().__init__([])
        book.load()
        self.book = book
        self.version: dict[str, int] = {}
        by_lane: dict[tuple[int, ...], dict[str, list[PlacementRequest]]] = {}
        if lane is None:
            tenants: dict[str, list[PlacementRequest]] = {}
            for r in reqs:
                lst = tenants.get(r.tenant_id)
                if lst is None:
                    tenants[r.tenant_id] = [r]
                else:
                    lst.append(r)
            if tenants:
                by_lane[(0,)] = tenants
        else:
            for r in reqs:
                key = lane(r)
                tenants = by_lane.get(key)  # type: ignore[assignment]
                if tenants is None:
                    tenants = by_lane[key] = {}
                lst = tenants.get(r.tenant_id)
                if lst is None:
                    tenants[r.tenant_id] = [r]
                else:
                    lst.append(r)
        share_of = book.share_of
        self._lanes: list[_Lane] = []
        for key in sorted(by_lane):
            ln = _Lane()
            qs = ln.queues
            heap = ln.heap
            for tenant, lst in by_lane[key].items():
                if len(lst) > 1:
                    lst.sort(key=within)
                qs[tenant] = deque(lst)
                heap.append((share_of.get(tenant, 0.0), lst[0].submitted_at, tenant, 0))
            heapq.heapify(heap)
            self._lanes.append(ln)
        self._li = 0
        #: the served tenant and its queue, between pop() and done()
        self._current: tuple[str, deque[PlacementRequest]] | None = None
        #: the served tenant's next entry, pushed by the next pop()
        self._pending: tuple[float, float, str, int] | None = None

    def pop(self) -> PlacementRequest | None:
        lanes = self._lanes
        while self._li < len(lanes):
            ln = lanes[self._li]
            heap = ln.heap
            pending = self._pending
            if pending is not None:
                # done() left the tenant's next entry here: push and pop in one sift
                self._pending = None
                entry = heapq.heappushpop(heap, pending)
            elif heap:
                entry = heapq.heappop(heap)
            else:
                self._li += 1
                continue
            version = self.version
            while True:
                share, age, tenant, ver = entry
                if ver == version.get(tenant, 0):
                    break
                # the tenant placed work since this entry was pushed: refresh
                entry = heapq.heappushpop(
                    heap,
                    (self.book.share(tenant), ln.queues[tenant][0].submitted_at, tenant, version[tenant]),
                )
            q = ln.queues[tenant]
            self._current = (tenant, q)
            return q.popleft()
        return None

    def done(self, req: PlacementRequest, placed: bool) -> None:
        current = self._current
        assert current is not None
        tenant, q = current
        if placed:
            self.book.charge(req)
            ver = self.version[tenant] = self.version.get(tenant, 0) + 1
        else:
            ver = self.version.get(tenant, 0)
        if q:
            self._pending = (self.book.share_of.get(tenant, 0.0), q[0].submitted_at, tenant, ver)
        self._current = None


def las_queue(attained: float, thresholds: tuple[float, ...]) -> int:
    for i, t in enumerate(thresholds):
        if attained < t:
            return i
    return len(thresholds)


def las_promote_at(policy: Policy, req: PlacementRequest) -> float:
    """When the starvation guard lifts ``req`` into the first attained-service
    queue: once its age reaches ``las_starve_s`` or ``las_starve_factor`` times
    its attained run time per GPU, whichever is longer."""
    per_gpu = req.attained_service / max(req.total_milli / WHOLE, 1e-9)
    return req.submitted_at + max(policy.las_starve_s, policy.las_starve_factor * per_gpu)


# ---------------------------------------------------------------- per-request memos
#
# A waiting request's attained-service queue, its promotion time and its remaining
# time depend on the request and the policy alone, not on the clock; the simulator
# hands plan() the same request objects call after call (and the live loop new
# ones), so they are worked out once per request object. An entry holds its
# request (and policy), so the id it is filed under cannot be reused while the
# entry lives; a lookup checks identity, never equality. Bounded: cleared when full.

_MEMO_MAX = 1 << 14  # the simulator hands plan() ~50 heads a call, rotating slowly
#: id(request) -> (request, policy, attained-service queue, promotion time)
_las_memo: dict[int, tuple[PlacementRequest, Policy, int, float]] = {}
#: id(request) -> (request, remaining time)
_remaining_memo: dict[int, tuple[PlacementRequest, float]] = {}


def _las_facts(policy: Policy, req: PlacementRequest) -> tuple[PlacementRequest, Policy, int, float]:
    """(req, policy, its attained-service queue, when the guard promotes it), memoised."""
    got = _las_memo.get(id(req))
    if got is None or got[0] is not req or got[1] is not policy:
        got = (req, policy, las_queue(req.attained_service, policy.las_thresholds), las_promote_at(policy, req))
        if len(_las_memo) >= _MEMO_MAX:
            _las_memo.clear()
        _las_memo[id(req)] = got
    return got


def las_level(policy: Policy, req: PlacementRequest, now: float) -> int:
    """The attained-service queue of a waiting request (0 = served first)."""
    if req.attained_service <= 0.0:
        return 0
    _r, _p, level, promote_at = _las_facts(policy, req)
    if level and now >= promote_at:
        return 0
    return level


def _remaining_time(req: PlacementRequest) -> float:
    if req.expected_duration is None:
        return math.inf
    per_gpu = max(req.total_milli / WHOLE, 1e-9)
    return max(req.expected_duration - req.attained_service / per_gpu, 0.0)


def remaining_time(req: PlacementRequest) -> float:
    """SRTF's key: expected duration minus the service already received (per GPU)."""
    got = _remaining_memo.get(id(req))
    if got is None or got[0] is not req:
        got = (req, _remaining_time(req))
        if len(_remaining_memo) >= _MEMO_MAX:
            _remaining_memo.clear()
        _remaining_memo[id(req)] = got
    return got[1]


def fair_orders(policy: Policy) -> bool:
    """Orders that serve tenants by share (the order inside a tenant is by
    ``order_key``, so a caller may hand the core only each tenant's head)."""
    return policy.queue_order in ("gpucloud", "drf")


def class_first(policy: Policy) -> bool:
    """Orders whose key starts with the class (``order_key``): no request is ever
    decided before one of a higher class, so none can take what a higher class
    would preempt it from at once."""
    return policy.queue_order in ("gpucloud", "priority")


def order_key(policy: Policy, req: PlacementRequest, now: float) -> tuple[object, ...]:
    """The order ``make_order`` serves requests in: over the whole queue for the
    static orders, inside one tenant for the fair ones. A key changes only when
    the request does, or (las, gpucloud) when the starvation guard promotes it
    (``las_promote_at``)."""
    kind = policy.queue_order
    if kind in ("fifo", "drf"):
        return (req.submitted_at, req.request_id)
    if kind == "gpucloud":
        return (
            CLASS_RANK.get(req.priority, 1),
            las_level(policy, req, now),
            learned_service(req),
            req.submitted_at,
            req.request_id,
        )
    if kind == "priority":
        return (CLASS_RANK.get(req.priority, 1), req.submitted_at, req.request_id)
    if kind == "sjf":
        d = req.expected_duration
        return (math.inf if d is None else d, req.submitted_at, req.request_id)
    if kind == "srtf":
        return (remaining_time(req), req.submitted_at, req.request_id)
    if kind == "las":
        return (las_level(policy, req, now), req.submitted_at, req.request_id)
    raise ValueError(f"unknown queue order {kind!r}")


def make_order(
    policy: Policy, queue: Iterable[PlacementRequest], book: ShareBook, now: float = 0.0
) -> Order:
    kind = policy.queue_order
    reqs = list(queue)
    if kind == "gpucloud":
        rank_of = CLASS_RANK.get

        def lane(r: PlacementRequest) -> tuple[int, ...]:
            if r.attained_service <= 0.0:
                return (rank_of(r.priority, 1), 0)
            return (rank_of(r.priority, 1), las_level(policy, r, now))

        return FairOrder(reqs, book, lane, _learned_age)
    if kind == "drf":
        return FairOrder(reqs, book, None)
    if kind not in QUEUE_ORDERS:
        raise ValueError(f"unknown queue order {kind!r}")
    reqs.sort(key=_static_key(policy, now))
    return Order(reqs)


def _static_key(policy: Policy, now: float) -> Callable[[PlacementRequest], tuple[object, ...]]:
    """``order_key`` of a static order, as a function of the request alone."""
    kind = policy.queue_order
    if kind == "fifo":
        return _AGE
    if kind == "srtf":
        return lambda r: (remaining_time(r), r.submitted_at, r.request_id)
    return lambda r: order_key(policy, r, now)
