"""Plans with a ``PlanCache`` equal the plans without one, call after call, for
every policy, with and without lending (owners preempt borrowed work under the
1x blast-radius cap), while work starts, stops, gets notice, requests arrive and
the clock moves in steps small and large (the cap, the time-slice quantum and
the las promotions read it). The oracle any memory kept between calls answers to."""

from __future__ import annotations

import random

import pytest

from scheduler.core import Allocation, ClusterSnapshot, HostPlacement, PlacementRequest, PlanCache, plan
from scheduler.core.model import WHOLE
from scheduler.core.policy import Policy, get_policy
from scheduler.core.testing import apply_plan, make_host, make_request, occupy, release, verify

NOW = 100_000.0
POLICY_NAMES = ("gpucloud", "priority", "fifo", "drf", "sjf", "las", "srtf")
TENANTS = ("t1", "t2", "t3")


def lending(policy: Policy) -> Policy:
    """The simulator's --lend: owners (standard) preempt borrowed work (low)."""
    if policy.preemption and policy.mode != "static":
        return policy
    return policy.with_(
        preemption=True,
        mode="hybrid",
        mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic")),
    )


def running(rng: random.Random, snap: ClusterSnapshot, k: int, now: float, tag: str) -> list[Allocation]:
    """Whole-GPU work on the free GPUs of a few hosts, mostly borrowed (low)."""
    free = {h.host_id: [g.uuid for g in h.gpus if not g.whole and not g.used_milli] for h in snap.hosts}
    out = []
    for i in range(k):
        hid = rng.choice(sorted(free))
        n = min(len(free[hid]), rng.choice((1, 1, 2, 4)))
        if not n:
            continue
        gpus, free[hid] = free[hid][:n], free[hid][n:]
        started = now - rng.choice((60.0, 700.0, 5000.0, 40_000.0))
        out.append(
            Allocation(
                request_id=f"run-{tag}-{i}",
                tenant_id=rng.choice(TENANTS),
                placements=(HostPlacement(hid, tuple(gpus), WHOLE),),
                gpu_model="H100",
                priority=rng.choice(("low", "low", "low", "standard")),
                kind="job",
                started_at=started,
                expected_end=rng.choice((None, now + rng.choice((100.0, 2000.0, 20_000.0, 200_000.0)))),
                restartable=True,
                checkpointable=rng.random() < 0.5,
                attained_service=rng.choice((0.0, 5000.0, 50_000.0)),
            )
        )
    return out


def arrivals(rng: random.Random, now: float, k: int, tag: str) -> list[PlacementRequest]:
    return [
        make_request(
            f"q-{tag}-{i}",
            tenant_id=rng.choice(TENANTS),
            gpus_per_node=rng.choice((1, 1, 2, 4, 8)),
            nodes=rng.choice((1, 1, 1, 2)),
            priority=rng.choice(("standard", "standard", "low", "critical")),
            kind="job",
            restartable=True,
            submitted_at=now - rng.choice((0.0, 100.0, 20_000.0)),
            expected_duration=rng.choice((None, 300.0, 3000.0, 30_000.0)),
            attained_service=rng.choice((0.0, 0.0, 4000.0, 40_000.0)),
        )
        for i in range(k)
    ]


def ended(snap: ClusterSnapshot, now: float) -> list[str]:
    """Work that stopped by ``now``: its notice ran out, or (sometimes) its time."""
    out = []
    for a in snap.allocations:
        if a.preempting and a.stop_by is not None and a.stop_by <= now:
            out.append(a.request_id)
        elif a.expected_end is not None and a.expected_end <= now:
            out.append(a.request_id)
    return out


@pytest.mark.parametrize("name", POLICY_NAMES)
@pytest.mark.parametrize("seed", range(12))
def test_a_cached_plan_is_the_plan_call_after_call(name: str, seed: int) -> None:
    rng = random.Random(seed)
    pol = lending(get_policy(name)) if seed % 3 else get_policy(name)
    now = NOW
    snap = ClusterSnapshot(hosts=tuple(make_host(f"h{i:02d}") for i in range(rng.randrange(4, 10))))
    snap = occupy(snap, running(rng, snap, 14, now, "0"))
    queue = tuple(arrivals(rng, now, rng.randrange(4, 14), "0"))
    cache = PlanCache()
    for cycle in range(1, 26):
        cached = plan(snap, queue, pol, now=now, cache=cache)
        assert cached == plan(snap, queue, pol, now=now)
        verify(snap, queue, cached)
        if rng.random() < 0.7:
            snap, queue = apply_plan(snap, queue, cached, now=now)
        # small steps mostly (the cap's clock), now and then a long one
        now += rng.choice((0.0, 0.5, 1.0, 20.0, 20.0, 400.0, 3600.0))
        gone = ended(snap, now)
        if gone and rng.random() < 0.6:
            snap = release(snap, gone)
        if rng.random() < 0.2:
            snap = occupy(snap, running(rng, snap, 2, now, str(cycle)))
        if rng.random() < 0.3:
            queue = queue + tuple(arrivals(rng, now, 2, str(cycle)))
