"""The per-request shortcuts of plan() answer exactly what the rules they stand for
answer: the queue's memoised keys (attained-service queue, promotion time, remaining
time, kept per request object), the fair order's lanes, and the victim search's
one pass over a host's work. Each is checked against the rule written out plainly
(an oracle), on drawn cases."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import Allocation, ClusterSnapshot, HostPlacement, PlacementRequest, get_policy
from scheduler.core.model import CLASS_RANK, WHOLE
from scheduler.core.planner.cycle import CycleState
from scheduler.core.policy import Policy
from scheduler.core.queue import (
    FairOrder,
    ShareBook,
    _las_memo,
    las_level,
    make_order,
    order_key,
    remaining_time,
)
from scheduler.core.testing import make_host, occupy

NOW = 100_000.0


# ------------------------------------------------------------------ the memoised keys


def las_level_rule(policy: Policy, req: PlacementRequest, now: float) -> int:
    """las_level as the policy defines it, worked out from scratch."""
    a = req.attained_service
    if a <= 0.0:
        return 0
    level = sum(1 for t in policy.las_thresholds if a >= t)
    per_gpu = a / max(req.total_milli / WHOLE, 1e-9)
    promote_at = req.submitted_at + max(policy.las_starve_s, policy.las_starve_factor * per_gpu)
    return 0 if level and now >= promote_at else level


def remaining_rule(req: PlacementRequest) -> float:
    if req.expected_duration is None:
        return math.inf
    return max(req.expected_duration - req.attained_service / max(req.total_milli / WHOLE, 1e-9), 0.0)


requests = st.builds(
    PlacementRequest,
    request_id=st.sampled_from(("a", "b", "c")),
    tenant_id=st.sampled_from(("t1", "t2")),
    gpu_model=st.just("H100"),
    gpus_per_node=st.sampled_from((0, 1, 2, 8)),
    gpu_milli=st.just(WHOLE),
    nodes=st.sampled_from((1, 2)),
    priority=st.sampled_from(("critical", "standard", "low")),
    submitted_at=st.sampled_from((0.0, 50_000.0, 99_000.0)),
    expected_duration=st.sampled_from((None, 0.0, 600.0, 90_000.0)),
    attained_service=st.sampled_from((0.0, 10.0, 3600.0, 40_000.0, 400_000.0)),
).map(lambda r: replace(r, gpu_milli=500) if r.gpus_per_node == 0 else r)


@settings(max_examples=300, deadline=None)
@given(
    reqs=st.lists(requests, min_size=1, max_size=6),
    nows=st.lists(st.sampled_from((0.0, 60_000.0, NOW, 500_000.0)), min_size=1, max_size=4),
)
def test_the_memoised_queue_keys_are_the_rule_for_every_request_object_and_policy(reqs, nows):  # type: ignore[no-untyped-def]
    # two policies of the same name with other thresholds: a memo must not mix them up
    policies = [
        get_policy("las"),
        get_policy("gpucloud"),
        get_policy("las").with_(las_thresholds=(100.0, 5000.0), las_starve_s=10.0),
    ]
    _las_memo.clear()
    for _round in range(2):  # the first round fills the memo, the second reads it
        for now in nows:
            for pol in policies:
                for r in reqs:
                    assert las_level(pol, r, now) == las_level_rule(pol, r, now)
                    assert remaining_time(r) == remaining_rule(r)


def test_a_request_equal_to_a_memoised_one_but_another_object_is_worked_out_anew() -> None:
    pol = get_policy("las")
    old = PlacementRequest(
        request_id="a", tenant_id="t1", gpu_model="H100", attained_service=40_000.0, submitted_at=NOW
    )
    assert las_level(pol, old, NOW) == 2
    # the same id but another attained service: a new object, never the old one's entry
    new = replace(old, attained_service=10.0)
    assert las_level(pol, new, NOW) == 0
    assert las_level(pol, old, NOW) == 2


# ------------------------------------------------------------------ the fair order


class ReferenceFairOrder:
    """FairOrder as first written: lanes by key, tenants by (share, age, tenant),
    refreshed lazily when a tenant placed work."""

    def __init__(self, reqs, book, lane):  # type: ignore[no-untyped-def]
        book.load()
        self.book = book
        self.version: dict[str, int] = {}
        lanes: dict = {}
        for r in reqs:
            lanes.setdefault(lane(r), {}).setdefault(r.tenant_id, []).append(r)
        self.ranks = sorted(lanes)
        self.queues: dict = {}
        self.heaps: dict = {}
        for rank in self.ranks:
            qs = {}
            heap = []
            for tenant, lst in lanes[rank].items():
                lst.sort(key=lambda r: (r.submitted_at, r.request_id))
                qs[tenant] = deque(lst)
                heap.append((book.share(tenant), lst[0].submitted_at, tenant, 0))
            heapq.heapify(heap)
            self.queues[rank] = qs
            self.heaps[rank] = heap
        self._ri = 0
        self._current = None
        self._pending = None

    def pop(self):  # type: ignore[no-untyped-def]
        while self._ri < len(self.ranks):
            rank = self.ranks[self._ri]
            heap = self.heaps[rank]
            if self._pending is not None:
                entry = heapq.heappushpop(heap, self._pending)
                self._pending = None
            elif heap:
                entry = heapq.heappop(heap)
            else:
                self._ri += 1
                continue
            while True:
                share, age, tenant, ver = entry
                current = self.version.get(tenant, 0)
                if ver == current:
                    break
                q = self.queues[rank][tenant]
                entry = heapq.heappushpop(heap, (self.book.share(tenant), q[0].submitted_at, tenant, current))
            self._current = (rank, tenant)
            return self.queues[rank][tenant].popleft()
        return None

    def done(self, req, placed):  # type: ignore[no-untyped-def]
        rank, tenant = self._current
        if placed:
            self.book.charge(req)
            self.version[tenant] = self.version.get(tenant, 0) + 1
        ver = self.version.get(tenant, 0)
        q = self.queues[rank][tenant]
        if q:
            self._pending = (self.book.share_of.get(tenant, 0.0), q[0].submitted_at, tenant, ver)
        self._current = None


def _book(snap: ClusterSnapshot, pol: Policy) -> ShareBook:
    return CycleState(snap, [], pol, NOW).shares


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(
        st.tuples(
            st.sampled_from(("t1", "t2", "t3", "t4")),
            st.sampled_from(("critical", "standard", "low")),
            st.sampled_from((0.0, 5000.0, 50_000.0)),
            st.integers(0, 20),
            st.sampled_from((1, 2, 4)),
        ),
        max_size=25,
    ),
    running=st.lists(st.tuples(st.sampled_from(("t1", "t2", "t3")), st.integers(1, 8)), max_size=4),
    placed=st.lists(st.booleans(), min_size=30, max_size=30),
    policy=st.sampled_from(("gpucloud", "drf")),
)
def test_the_fair_order_serves_what_the_reference_served(specs, running, placed, policy):  # type: ignore[no-untyped-def]
    reqs = [
        PlacementRequest(
            request_id=f"r{i}", tenant_id=t, gpu_model="H100", gpus_per_node=g, priority=prio,  # type: ignore[arg-type]
            submitted_at=float(sub), attained_service=att,
        )
        for i, (t, prio, att, sub, g) in enumerate(specs)
    ]
    hosts = tuple(make_host(f"h{i}", gpus=8) for i in range(4))
    allocs = [
        Allocation(
            request_id=f"run{i}",
            tenant_id=t,
            placements=(HostPlacement(f"h{i}", tuple(f"h{i}-g{j}" for j in range(n))),),
            gpu_model="H100",
        )
        for i, (t, n) in enumerate(running)
    ]
    snap = occupy(ClusterSnapshot(hosts=hosts), allocs)
    pol = get_policy(policy)
    if policy == "gpucloud":

        def lane(r: PlacementRequest) -> tuple[int, ...]:
            return (CLASS_RANK.get(r.priority, 1), las_level(pol, r, NOW))

        ref = ReferenceFairOrder(list(reqs), _book(snap, pol), lane)
    else:
        ref = ReferenceFairOrder(list(reqs), _book(snap, pol), lambda r: (0,))
    new = make_order(pol, list(reqs), _book(snap, pol), NOW)
    assert isinstance(new, FairOrder)
    served_ref, served_new = [], []
    for i in range(len(reqs) + 1):
        a, b = ref.pop(), new.pop()
        served_ref.append(a)
        served_new.append(b)
        if a is None or b is None:
            break
        ref.done(a, placed[i % len(placed)])
        new.done(b, placed[i % len(placed)])
    assert served_new == served_ref


@settings(max_examples=100, deadline=None)
@given(reqs=st.lists(requests, max_size=8), policy=st.sampled_from(("fifo", "sjf", "srtf", "las", "priority")))
def test_a_static_order_sorts_by_order_key(reqs, policy):  # type: ignore[no-untyped-def]
    reqs = [replace(r, request_id=f"r{i}") for i, r in enumerate(reqs)]
    pol = get_policy(policy)
    snap = ClusterSnapshot(hosts=(make_host("h0"),))
    order = make_order(pol, reqs, _book(snap, pol), NOW)
    served = []
    while (r := order.pop()) is not None:
        served.append(r)
    assert served == sorted(reqs, key=lambda r: order_key(pol, r, NOW))
