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

from .model import CLASS_RANK, WHOLE, ClusterSnapshot, PlacementRequest
from .policy import QUEUE_ORDERS, Policy
from .state import Fleet

_AGE = operator.attrgetter("submitted_at", "request_id")


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


class FairOrder(Order):
    """Class, then (for ``gpucloud``) attained-service queue, then weighted
    dominant share (live), then age. ``lane`` gives each request its lane; lanes
    are served in order, tenants inside a lane by share."""

    def __init__(
        self,
        reqs: Iterable[PlacementRequest],
        book: ShareBook,
        lane: Callable[[PlacementRequest], tuple[int, ...]],
    ) -> None:
        super().__init__([])
        book.load()
        self.book = book
        self.version: dict[str, int] = {}
        lanes: dict[tuple[int, ...], dict[str, list[PlacementRequest]]] = {}
        for r in reqs:
            lanes.setdefault(lane(r), {}).setdefault(r.tenant_id, []).append(r)
        self.ranks = sorted(lanes)
        self.queues: dict[tuple[int, ...], dict[str, deque[PlacementRequest]]] = {}
        self.heaps: dict[tuple[int, ...], list[tuple[float, float, str, int]]] = {}
        for rank in self.ranks:
            qs: dict[str, deque[PlacementRequest]] = {}
            heap: list[tuple[float, float, str, int]] = []
            for tenant, lst in lanes[rank].items():
                lst.sort(key=_AGE)
                qs[tenant] = deque(lst)
                heap.append((book.share(tenant), lst[0].submitted_at, tenant, 0))
            heapq.heapify(heap)
            self.queues[rank] = qs
            self.heaps[rank] = heap
        self._ri = 0
        self._current: tuple[tuple[int, ...], str] | None = None
        #: the served tenant's next entry, pushed by the next pop()
        self._pending: tuple[float, float, str, int] | None = None

    def pop(self) -> PlacementRequest | None:
        while self._ri < len(self.ranks):
            rank = self.ranks[self._ri]
            heap = self.heaps[rank]
            pending = self._pending
            if pending is not None:
                # done() left the tenant's next entry here: push and pop in one sift
                self._pending = None
                entry = heapq.heappushpop(heap, pending)
            elif heap:
                entry = heapq.heappop(heap)
            else:
                self._ri += 1
                continue
            version = self.version
            while True:
                share, age, tenant, ver = entry
                current = version.get(tenant, 0)
                if ver == current:
                    break
                # the tenant placed work since this entry was pushed: refresh
                q = self.queues[rank][tenant]
                entry = heapq.heappushpop(
                    heap, (self.book.share(tenant), q[0].submitted_at, tenant, current)
                )
            self._current = (rank, tenant)
            return self.queues[rank][tenant].popleft()
        return None

    def done(self, req: PlacementRequest, placed: bool) -> None:
        assert self._current is not None
        rank, tenant = self._current
        book = self.book
        if placed:
            book.charge(req)
            ver = self.version[tenant] = self.version.get(tenant, 0) + 1
        else:
            ver = self.version.get(tenant, 0)
        q = self.queues[rank][tenant]
        if q:
            self._pending = (book.share_of.get(tenant, 0.0), q[0].submitted_at, tenant, ver)
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


def las_level(policy: Policy, req: PlacementRequest, now: float) -> int:
    """The attained-service queue of a waiting request (0 = served first)."""
    a = req.attained_service
    if a <= 0.0:
        return 0
    level = las_queue(a, policy.las_thresholds)
    if level and now >= las_promote_at(policy, req):
        return 0
    return level


def remaining_time(req: PlacementRequest) -> float:
    """SRTF's key: expected duration minus the service already received (per GPU)."""
    if req.expected_duration is None:
        return math.inf
    per_gpu = max(req.total_milli / WHOLE, 1e-9)
    return max(req.expected_duration - req.attained_service / per_gpu, 0.0)


def fair_orders(policy: Policy) -> bool:
    """Orders that serve tenants by share (the order inside a tenant is by
    ``order_key``, so a caller may hand the core only each tenant's head)."""
    return policy.queue_order in ("gpucloud", "drf")


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

        return FairOrder(reqs, book, lane)
    if kind == "drf":
        return FairOrder(reqs, book, _ONE_LANE)
    if kind not in QUEUE_ORDERS:
        raise ValueError(f"unknown queue order {kind!r}")
    reqs.sort(key=lambda r: order_key(policy, r, now))
    return Order(reqs)


def _ONE_LANE(r: PlacementRequest) -> tuple[int, ...]:
    return (0,)
