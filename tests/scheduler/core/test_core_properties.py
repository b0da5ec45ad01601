"""Invariants of plan() over random fleets and queues (Hypothesis)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import (
    WHOLE,
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    HostView,
    Place,
    PlacementRequest,
    PlanCache,
    Policy,
    QuotaRule,
    TenantView,
    Wait,
    get_policy,
    plan,
)
from scheduler.core.testing import apply_plan, make_host, occupy, release, verify

NOW = 1_000.0
MODELS = ("H100", "A100")
REGIONS = ("r1", "r2")
CLASSES = ("critical", "standard", "low")
POLICY_NAMES = ("gpucloud", "priority", "fifo", "drf", "sjf", "las", "srtf")


@st.composite
def fleets(draw: st.DrawFn, *, max_hosts: int = 6, with_shares: bool = True) -> ClusterSnapshot:
    n = draw(st.integers(1, max_hosts))
    hosts = []
    allocs: list[Allocation] = []
    for h in range(n):
        gpus = draw(st.sampled_from((2, 4, 8)))
        hid = f"h{h}"
        hosts.append(
            make_host(
                hid,
                model=draw(st.sampled_from(MODELS)),
                gpus=gpus,
                region=draw(st.sampled_from(REGIONS)),
                island_size=draw(st.sampled_from((2, 4, 8))),
                ready=draw(st.booleans()) or h == 0,
                vcpus=draw(st.sampled_from((32, 64, 128))),
                memory_mib=draw(st.sampled_from((256, 512))) * 1024,
            )
        )
        free = list(range(gpus))
        for a in range(draw(st.integers(0, 3))):
            if not free:
                break
            share = with_shares and draw(st.booleans()) and draw(st.booleans())
            take = 1 if share else draw(st.integers(1, len(free)))
            idx, free = free[:take], free[take:]
            allocs.append(
                Allocation(
                    request_id=f"run-{hid}-{a}",
                    tenant_id=draw(st.sampled_from(("t1", "t2", "t3"))),
                    placements=(
                        HostPlacement(
                            hid,
                            tuple(f"{hid}-g{i}" for i in idx),
                            draw(st.sampled_from((250, 500))) if share else WHOLE,
                        ),
                    ),
                    gpu_model=hosts[-1].gpus[0].model,
                    priority=draw(st.sampled_from(CLASSES)),
                    billing=draw(st.sampled_from(("spot", "on_demand"))),
                    started_at=NOW - draw(st.integers(1, 10_000)),
                    expected_end=draw(
                        st.one_of(st.none(), st.integers(1, 5000).map(lambda d: NOW + d))
                    ),
                    vcpus=draw(st.sampled_from((0, 4, 8))),
                    memory_mib=draw(st.sampled_from((0, 8192))),
                )
            )
    tenants = (
        TenantView(tenant_id="t1", weight=1.0),
        TenantView(
            tenant_id="t2",
            weight=2.0,
            quotas=(QuotaRule(max_gpus=draw(st.integers(0, 6)), gpu_model="H100"),),
        ),
        TenantView(
            tenant_id="t3",
            quotas=(
                QuotaRule(max_gpus=draw(st.integers(0, 10)), region="r1"),
                QuotaRule(max_instances=draw(st.integers(0, 4))),
            ),
        ),
    )
    return occupy(ClusterSnapshot(hosts=tuple(hosts), tenants=tenants), allocs)


@st.composite
def requests(draw: st.DrawFn, *, max_n: int = 20) -> list[PlacementRequest]:
    out = []
    for i in range(draw(st.integers(0, max_n))):
        frac = draw(st.integers(0, 3)) == 0
        g = 0 if frac else draw(st.sampled_from((1, 1, 2, 4, 8)))
        out.append(
            PlacementRequest(
                request_id=f"r{i}",
                tenant_id=draw(st.sampled_from(("t1", "t2", "t3", "t4"))),
                gpu_model=draw(st.sampled_from(MODELS)),
                gpus_per_node=g,
                gpu_milli=draw(st.sampled_from((125, 250, 500, 750))) if frac else WHOLE,
                nodes=1 if frac else draw(st.sampled_from((1, 1, 1, 2))),
                vcpus=draw(st.sampled_from((0, 4, 16))),
                memory_mib=draw(st.sampled_from((0, 16384))),
                region=draw(st.sampled_from((None, *REGIONS))),
                priority=draw(st.sampled_from(CLASSES)),
                billing=draw(st.sampled_from(("spot", "on_demand"))),
                submitted_at=draw(st.integers(0, 100)),
                expected_duration=draw(st.one_of(st.none(), st.integers(10, 5000))),
                attained_service=draw(st.sampled_from((0.0, 5000.0, 50000.0))),
            )
        )
    return out


def policies() -> st.SearchStrategy[Policy]:
    base = st.sampled_from(POLICY_NAMES).map(get_policy)
    return st.one_of(
        base,
        st.builds(
            lambda p, pl, topo: p.with_(placement=pl, topology=topo),
            base,
            st.sampled_from(("first-fit", "best-fit", "binpack", "spread", "frag-aware")),
            st.sampled_from(("prefer", "require")),
        ),
    )


def quota_usage(
    snapshot: ClusterSnapshot, allocs: tuple[Allocation, ...], rule: QuotaRule, tenant: str
) -> tuple[int, int]:
    region = {h.host_id: h.region for h in snapshot.hosts}
    milli = count = 0
    for a in allocs:
        if a.tenant_id != tenant:
            continue
        if rule.gpu_model is not None and a.gpu_model != rule.gpu_model:
            continue
        if rule.region is not None and region[a.placements[0].host_id] != rule.region:
            continue
        milli += sum(len(p.gpus) * p.milli for p in a.placements)
        count += 1
    return milli, count


@given(fleets(), requests(), policies())
def test_plans_never_overbook_split_gangs_or_mix_whole_and_shares(s, queue, pol):  # type: ignore[no-untyped-def]
    verify(s, queue, plan(s, queue, pol, now=NOW))


@given(fleets(), requests(), policies())
def test_no_tenant_ends_a_cycle_over_its_quota(s, queue, pol):  # type: ignore[no-untyped-def]
    p = plan(s, queue, pol, now=NOW)
    after, _ = apply_plan(s, queue, p, now=NOW)
    new = tuple(a for a in after.allocations if a.started_at == NOW)
    for t in s.tenants:
        for rule in t.quotas:
            before_m, before_n = quota_usage(s, s.allocations, rule, t.tenant_id)
            add_m, add_n = quota_usage(after, new, rule, t.tenant_id)
            if rule.max_gpus is not None and add_m:
                assert before_m + add_m <= max(rule.max_gpus * WHOLE, before_m)
            if rule.max_instances is not None and add_n:
                assert before_n + add_n <= max(rule.max_instances, before_n)


@given(fleets(), requests(), policies())
def test_same_input_same_plan_whatever_the_queue_order(s, queue, pol):  # type: ignore[no-untyped-def]
    p1 = plan(s, queue, pol, now=NOW)
    assert plan(s, queue, pol, now=NOW) == p1
    assert plan(s, list(reversed(queue)), pol, now=NOW) == p1


def fits_after(
    req: PlacementRequest, host: HostView, snapshot: ClusterSnapshot, gone: set[str]
) -> bool:
    """Brute force: does ``req`` fit on ``host`` once allocations ``gone`` stop?"""
    if not host.ready or host.region != (req.region or host.region):
        return False
    s = release(snapshot, gone)
    h = next(x for x in s.hosts if x.host_id == host.host_id)
    if h.free_vcpus < req.vcpus or h.free_memory_mib < req.memory_mib:
        return False
    gpus = [g for g in h.gpus if g.model == req.gpu_model]
    if req.gpus_per_node == 0:
        # tenant isolation: a GPU carrying another tenant's shares takes none of req's
        return any(
            not g.whole
            and WHOLE - g.used_milli >= req.gpu_milli
            and (g.cross_tenant or g.used_milli == 0 or g.share_tenant == req.tenant_id)
            for g in gpus
        )
    return sum(1 for g in gpus if not g.whole and g.used_milli == 0) >= req.gpus_per_node


@given(fleets(max_hosts=4), st.sampled_from(("critical", "standard")), st.data())
def test_a_higher_class_only_waits_when_no_lower_class_victims_could_make_room(s, cls, data):  # type: ignore[no-untyped-def]
    g = data.draw(st.sampled_from((0, 1, 2, 4, 8)))
    req = PlacementRequest(
        request_id="hi",
        tenant_id="t1",
        gpu_model=data.draw(st.sampled_from(MODELS)),
        gpus_per_node=g,
        gpu_milli=500 if g == 0 else WHOLE,
        priority=cls,
        vcpus=data.draw(st.sampled_from((0, 4))),
    )
    # dynamic, preemption on, no blast-radius cap (test_core_blast_radius.py has the cap)
    pol = get_policy("priority").with_(topology="prefer", preempt_cap=math.inf)
    p = plan(s, [req], pol, now=NOW)
    rank = CLASSES.index(cls)
    lower = {a.request_id for a in s.allocations if CLASSES.index(a.priority) > rank}
    if isinstance(p.decision_for("hi"), Place):
        return
    victims = {x.victim_id for x in p.preempts}
    if victims:
        assert victims <= lower, "preempted the same or a higher class"
        assert any(fits_after(req, h, s, victims) for h in s.hosts), "victims do not make room"
    else:
        assert not any(fits_after(req, h, s, lower) for h in s.hosts), (
            "waits although preempting lower classes would make room"
        )


def earliest_start(req: PlacementRequest, s: ClusterSnapshot, now: float) -> float:
    """Brute force: the earliest time ``req`` fits on some host if work ends as expected."""
    best = math.inf
    for h in s.hosts:
        on_host = sorted(
            (a.expected_end if a.expected_end is not None else math.inf, a.request_id)
            for a in s.allocations
            if any(p.host_id == h.host_id for p in a.placements)
        )
        if fits_after(req, h, s, set()):
            return now
        gone: set[str] = set()
        for end, rid in on_host:
            if end == math.inf:
                break
            gone.add(rid)
            if fits_after(req, h, s, gone):
                best = min(best, end)
                break
    return best


@given(st.data())
def test_backfill_never_delays_the_reservation_of_the_head_of_the_queue(data):  # type: ignore[no-untyped-def]
    n = data.draw(st.integers(1, 4))
    hosts = [make_host(f"h{i}", gpus=8) for i in range(n)]
    allocs = []
    for i in range(n):
        k = data.draw(st.integers(1, 8))  # every host holds something: the head blocks
        allocs.append(
            Allocation(
                request_id=f"run{i}",
                tenant_id="t9",
                placements=(HostPlacement(f"h{i}", tuple(f"h{i}-g{j}" for j in range(k))),),
                gpu_model="H100",
                started_at=0.0,
                expected_end=data.draw(
                    st.one_of(st.none(), st.integers(1, 3000).map(lambda d: NOW + d))
                ),
            )
        )
    s = occupy(ClusterSnapshot(hosts=tuple(hosts)), allocs)
    head = PlacementRequest(
        request_id="head", tenant_id="t1", gpu_model="H100", gpus_per_node=8, priority="critical"
    )
    others = [
        PlacementRequest(
            request_id=f"o{i}",
            tenant_id=f"t{i % 3 + 2}",
            gpu_model="H100",
            gpus_per_node=data.draw(st.sampled_from((0, 1, 2, 4))),
            gpu_milli=WHOLE,
            submitted_at=i,
            expected_duration=data.draw(st.one_of(st.none(), st.integers(10, 4000))),
        )
        for i in range(data.draw(st.integers(1, 12)))
    ]
    others = [replace(o, gpu_milli=250) if o.gpus_per_node == 0 else o for o in others]
    queue = [head, *others]
    before = earliest_start(head, s, NOW)
    pol = get_policy("gpucloud").with_(preemption=False, topology="prefer", reclaim=False)
    p = plan(s, queue, pol, now=NOW)
    verify(s, queue, p)
    assert isinstance(p.decision_for("head"), Wait)
    after, _ = apply_plan(s, queue, p, now=NOW)
    assert earliest_start(head, after, NOW) <= before


def test_equal_weight_tenants_converge_to_equal_shares_over_cycles():
    # tenant a starts out holding the whole fleet; its work ends one GPU per cycle
    hosts = [make_host(f"h{i}", gpus=4) for i in range(3)]
    allocs = [
        Allocation(
            request_id=f"a-old{i}",
            tenant_id="a",
            placements=(HostPlacement(f"h{i // 4}", (f"h{i // 4}-g{i % 4}",)),),
            gpu_model="H100",
            expected_end=float(i + 1),
        )
        for i in range(12)
    ]
    s = occupy(ClusterSnapshot(hosts=tuple(hosts)), allocs)
    queue: tuple[PlacementRequest, ...] = tuple(
        PlacementRequest(request_id=f"{t}{i}", tenant_id=t, gpu_model="H100", submitted_at=i)
        for t in ("a", "b")
        for i in range(30)
    )
    for cycle in range(1, 20):
        ended = [
            a.request_id
            for a in s.allocations
            if a.expected_end is not None and a.expected_end <= cycle
        ]
        s = release(s, ended)
        p = plan(s, queue, "drf", now=float(cycle))
        verify(s, queue, p)
        s, queue = apply_plan(s, queue, p, now=float(cycle))
    held = {t: sum(1 for a in s.allocations if a.tenant_id == t) for t in ("a", "b")}
    assert held == {"a": 6, "b": 6}


@given(fleets(), requests(), policies(), st.data())
def test_a_plan_cache_never_changes_the_plan(s, queue, pol, data):  # type: ignore[no-untyped-def]
    # The simulator keeps a PlanCache between cycles; the plan must be the one the
    # stateless call gives, cycle after cycle, whether or not the last plan was
    # applied, and when the policy (hence the scoring plugins) changes in between.
    cache = PlanCache()
    now = NOW
    for _cycle in range(4):
        if data.draw(st.booleans()):
            pol = data.draw(policies())
        cached = plan(s, queue, pol, now=now, cache=cache)
        assert cached == plan(s, queue, pol, now=now)
        if data.draw(st.booleans()):
            s, queue = apply_plan(s, queue, cached, now=now)
        now += data.draw(st.sampled_from((0, 10, 3600)))
