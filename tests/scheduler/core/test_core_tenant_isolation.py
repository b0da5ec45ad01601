"""Tenant isolation of shared GPUs: a GPU's shares go to one tenant at a time,
unless the GPU is open to cross-tenant sharing (MIG, or the operator's choice per
GPU model). Table tests for the rule and the filter, plans in one cycle, and a
Hypothesis property over random fleets, queues, policies and several cycles."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import (
    OK,
    SEVERAL_TENANTS,
    WHOLE,
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    Place,
    PlacementRequest,
    Wait,
    get_policy,
    plan,
    share_open,
)
from scheduler.core.plugins import FreeGpusFilter
from scheduler.core.state import Fleet
from scheduler.core.testing import apply_plan, make_host, make_request, occupy, release, verify

NOW = 1_000.0
TENANTS = ("t1", "t2", "t3", "t4")


def snap(*hosts, allocs=()):  # type: ignore[no-untyped-def]
    return occupy(ClusterSnapshot(hosts=hosts), list(allocs))


def share(rid: str, tenant: str, milli: int = 250, **kw: object) -> PlacementRequest:
    return make_request(rid, tenant_id=tenant, gpus_per_node=0, gpu_milli=milli, **kw)


def running_share(rid: str, tenant: str, gpu: str, milli: int = 250, **kw: object) -> Allocation:
    host = gpu.split("-g")[0]
    return Allocation(
        request_id=rid, tenant_id=tenant, gpu_model="H100",
        placements=(HostPlacement(host, (gpu,), milli),), started_at=0.0, **kw,  # type: ignore[arg-type]
    )


def share_tenants(s: ClusterSnapshot) -> dict[str, set[str]]:
    """GPU uuid -> tenants holding shares on it, from the allocations (ground truth)."""
    out: dict[str, set[str]] = defaultdict(set)
    for a in s.allocations:
        for p in a.placements:
            if p.milli < WHOLE:
                for u in p.gpus:
                    out[u].add(a.tenant_id)
    return out


def assert_isolated(s: ClusterSnapshot) -> None:
    cross = {g.uuid for h in s.hosts for g in h.gpus if g.cross_tenant}
    for uuid, tenants in share_tenants(s).items():
        assert len(tenants) <= 1 or uuid in cross, f"{uuid} carries shares of {sorted(tenants)}"


# ----------------------------------------------------------------------- the rule, as a table


@pytest.mark.parametrize(
    ("owner", "tenant", "expected"),
    [
        (None, "t1", True),  # no shares on it (or open to sharing)
        ("t1", "t1", True),  # its own tenant's shares
        ("t2", "t1", False),  # another tenant's shares
        (SEVERAL_TENANTS, "t1", False),  # several (or unknown) tenants: closed to all
    ],
)
def test_share_open(owner, tenant, expected):  # type: ignore[no-untyped-def]
    assert share_open(owner, tenant) is expected


def _state(host):  # type: ignore[no-untyped-def]
    return Fleet(ClusterSnapshot(hosts=(host,)), NOW).slices[host.host_id][0]


@pytest.mark.parametrize(
    ("gpus", "shares", "holder", "cross", "tenant", "ok"),
    [
        (1, {}, None, False, "t2", True),  # a free GPU
        (1, {0: 250}, "t1", False, "t1", True),  # the tenant's own shared GPU
        (1, {0: 250}, "t1", False, "t2", False),  # another tenant's shares: refused
        (1, {0: 250}, None, False, "t2", False),  # shares of an unknown tenant: refused
        (1, {0: 250}, "t1", True, "t2", True),  # open to cross-tenant sharing (MIG / operator)
        (2, {0: 250}, "t1", False, "t2", True),  # the other GPU is free
        (2, {0: 250, 1: 500}, "t1", False, "t2", False),  # both carry t1's shares
        (1, {0: 900}, "t1", False, "t1", False),  # its own, but too little room
    ],
)
def test_free_gpus_filter_keeps_tenants_apart(gpus, shares, holder, cross, tenant, ok):  # type: ignore[no-untyped-def]
    host = make_host("h", gpus=gpus, shares=shares, share_tenant=holder, cross_tenant=cross)
    st_ = FreeGpusFilter().filter(share("r", tenant), _state(host))
    assert (st_ is OK) is ok


# ---------------------------------------------------------------------------- one cycle


@pytest.mark.parametrize("placement", ["first-fit", "best-fit", "binpack", "spread", "frag-aware", "fgd"])
def test_two_tenants_in_one_cycle_never_land_on_one_gpu(placement):  # type: ignore[no-untyped-def]
    s = snap(make_host("h", gpus=2))
    queue = [share("a", "t1"), share("b", "t2"), share("c", "t1"), share("d", "t2")]
    p = plan(s, queue, get_policy("fifo").with_(placement=placement), now=NOW)
    verify(s, queue, p)
    gpu_of = {d.request_id: d.placements[0].gpus[0] for d in p.places}
    assert set(gpu_of) == {"a", "b", "c", "d"}
    assert gpu_of["a"] == gpu_of["c"] and gpu_of["b"] == gpu_of["d"]
    assert gpu_of["a"] != gpu_of["b"]


def test_a_second_tenant_waits_when_the_only_gpu_carries_the_first_tenants_shares():
    s = snap(make_host("h", gpus=1))
    queue = [share("a", "t1"), share("b", "t2")]
    p = plan(s, queue, "fifo", now=NOW)
    assert isinstance(p.decision_for("a"), Place)
    assert isinstance(p.decision_for("b"), Wait)


def test_a_gpu_open_to_cross_tenant_sharing_takes_shares_of_several_tenants():
    s = snap(make_host("h", gpus=1, cross_tenant=True))
    queue = [share("a", "t1"), share("b", "t2")]
    p = plan(s, queue, "fifo", now=NOW)
    assert {d.request_id for d in p.places} == {"a", "b"}


def test_running_shares_of_another_tenant_keep_a_gpu_closed():
    s = snap(make_host("h", gpus=2), allocs=[running_share("x", "t1", "h-g0")])
    p = plan(s, [share("b", "t2")], "fifo", now=NOW)
    d = p.decision_for("b")
    assert isinstance(d, Place) and d.placements[0].gpus == ("h-g1",)


def test_preemption_frees_a_gpu_of_another_tenants_shares_for_a_higher_class():
    s = snap(
        make_host("h", gpus=1),
        allocs=[running_share("x", "t1", "h-g0", priority="low")],
    )
    req = share("hi", "t2", priority="critical")
    p = plan(s, [req], get_policy("priority"), now=NOW)
    # the GPU has room for the share, but it is t1's: the share waits for t1 to leave
    assert [x.victim_id for x in p.preempts] == ["x"]
    assert isinstance(p.decision_for("hi"), Wait)
    after = release(s, ["x"])
    assert isinstance(plan(after, [req], get_policy("priority"), now=NOW).decision_for("hi"), Place)


def test_backfill_reserves_a_gpu_only_once_the_other_tenants_shares_end():
    s = snap(
        make_host("h", gpus=1),
        allocs=[running_share("x", "t1", "h-g0", expected_end=NOW + 100)],
    )
    head = share("head", "t2", submitted_at=0)
    later = share("later", "t1", submitted_at=1, expected_duration=500)
    p = plan(s, [head, later], get_policy("gpucloud").with_(preemption=False), now=NOW)
    assert isinstance(p.decision_for("head"), Wait)
    # t1's own GPU has room, but the head holds it from NOW+100 on: a 500 s job would delay it
    assert isinstance(p.decision_for("later"), Wait)


# ------------------------------------------------------------------------------ property


@st.composite
def shared_fleets(draw: st.DrawFn) -> ClusterSnapshot:
    hosts = []
    allocs: list[Allocation] = []
    for h in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 4))
        hid = f"h{h}"
        hosts.append(make_host(hid, gpus=n, cross_tenant=draw(st.integers(0, 4)) == 0,
                               vcpus=64, memory_mib=512 * 1024))
        for i in range(n):
            # each GPU: free, one tenant's shares, or held whole
            kind = draw(st.sampled_from(("free", "free", "shares", "whole")))
            if kind == "whole":
                allocs.append(Allocation(
                    request_id=f"w-{hid}-{i}", tenant_id=draw(st.sampled_from(TENANTS)),
                    placements=(HostPlacement(hid, (f"{hid}-g{i}",)),), gpu_model="H100",
                    priority=draw(st.sampled_from(("standard", "low"))),
                    expected_end=draw(st.one_of(st.none(), st.integers(1, 500).map(lambda d: NOW + d))),
                ))
            elif kind == "shares":
                tenant = draw(st.sampled_from(TENANTS))
                for k in range(draw(st.integers(1, 2))):
                    allocs.append(running_share(
                        f"s-{hid}-{i}-{k}", tenant, f"{hid}-g{i}", 250,
                        priority=draw(st.sampled_from(("standard", "low"))),
                        expected_end=draw(st.one_of(st.none(), st.integers(1, 500).map(lambda d: NOW + d))),
                    ))
    return snap(*hosts, allocs=allocs)


@st.composite
def mixed_queues(draw: st.DrawFn) -> list[PlacementRequest]:
    out = []
    for i in range(draw(st.integers(1, 16))):
        whole = draw(st.integers(0, 4)) == 0
        out.append(make_request(
            f"r{i}", tenant_id=draw(st.sampled_from(TENANTS)),
            gpus_per_node=1 if whole else 0,
            gpu_milli=WHOLE if whole else draw(st.sampled_from((125, 250, 500, 750))),
            vcpus=draw(st.sampled_from((0, 4))),
            priority=draw(st.sampled_from(("critical", "standard", "low"))),
            submitted_at=i,
            expected_duration=draw(st.one_of(st.none(), st.integers(10, 1000))),
        ))
    return out


POLICIES = st.builds(
    lambda name, placement: get_policy(name).with_(placement=placement),
    st.sampled_from(("gpucloud", "priority", "fifo", "drf", "sjf")),
    st.sampled_from(("first-fit", "best-fit", "binpack", "spread", "frag-aware", "fgd")),
)


@settings(max_examples=150, deadline=None)
@given(shared_fleets(), mixed_queues(), POLICIES)
def test_no_gpu_ever_carries_shares_of_two_tenants_unless_open_to_sharing(s, queue, pol):  # type: ignore[no-untyped-def]
    assert_isolated(s)
    now = NOW
    for _cycle in range(3):
        p = plan(s, queue, pol, now=now)
        verify(s, queue, p)  # checks isolation decision by decision too
        s, queue = apply_plan(s, queue, p, now=now)
        assert_isolated(s)
        # time passes: work under notice stops, work past its expected end ends
        now += 300
        ended = [
            a.request_id for a in s.allocations
            if (a.stop_by is not None and a.stop_by <= now)
            or (a.expected_end is not None and a.expected_end <= now)
        ]
        s = release(s, ended)
        assert_isolated(s)


def test_the_property_fails_on_a_planner_that_ignores_tenants():
    """The check above can fail: opening every GPU to sharing in the core's eyes (but
    not in the ground truth) lets two tenants meet on one GPU, and assert_isolated
    sees it."""
    s = snap(make_host("h", gpus=1))
    queue = [share("a", "t1"), share("b", "t2")]
    blind = replace(s, hosts=tuple(
        replace(h, gpus=tuple(replace(g, cross_tenant=True) for g in h.gpus)) for h in s.hosts
    ))
    after, _ = apply_plan(s, queue, plan(blind, queue, "fifo", now=NOW), now=NOW)
    with pytest.raises(AssertionError, match="carries shares of"):
        assert_isolated(after)
