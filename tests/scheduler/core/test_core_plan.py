"""Scenario tests of plan(): one behaviour each, read as sentences."""

from __future__ import annotations

import pytest

from scheduler.core import (
    POLICIES,
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    Migrate,
    Place,
    Preempt,
    QuotaRule,
    Reject,
    TenantView,
    Wait,
    get_policy,
    plan,
)
from scheduler.core.blockers import Blocker
from scheduler.core.testing import make_host, make_request, occupy, verify

NOW = 10_000.0


def snap(*hosts, allocs=(), tenants=()):  # type: ignore[no-untyped-def]
    s = ClusterSnapshot(hosts=tuple(hosts), tenants=tuple(tenants))
    return occupy(s, list(allocs)) if allocs else s


def alloc(rid, host, gpus, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("tenant_id", "t9")
    kw.setdefault("gpu_model", "H100")
    return Allocation(
        request_id=rid,
        placements=(HostPlacement(host, tuple(f"{host}-g{i}" for i in gpus)),),
        **kw,
    )


def decide(s, queue, policy="gpucloud", now=NOW):  # type: ignore[no-untyped-def]
    p = plan(s, queue, policy, now=now)
    verify(s, queue, p)
    return p


# ---------------------------------------------------------------------- admission


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (make_request("r", gpu_model="B200"), "the fleet has no B200 GPUs"),
        (make_request("r", region="mars"), "the fleet has no H100 GPUs in mars"),
        (
            make_request("r", gpus_per_node=16),
            "asks for 16 H100 GPUs on one host but the largest H100 host has 8",
        ),
        (
            make_request("r", gpus_per_node=8, nodes=3),
            "asks for 3 hosts with 8 H100 GPUs each but the fleet has 2",
        ),
        (make_request("r", vcpus=4096), "asks for 4096 vCPUs but the largest host has 128"),
        (make_request("r", gpus_per_node=0, gpu_milli=1000), "between 1 and 999"),
        (make_request("r", gpus_per_node=2, gpu_milli=500), "take whole GPUs"),
        (make_request("r", gpus_per_node=0, gpu_milli=500, nodes=2), "single-node"),
    ],
)
def test_work_the_fleet_could_never_place_is_rejected_with_the_reason(req, reason):  # type: ignore[no-untyped-def]
    p = decide(snap(make_host("h1"), make_host("h2")), [req])
    (d,) = p.decisions
    assert isinstance(d, Reject)
    assert reason in d.reason


def test_hosts_that_are_down_still_count_as_fleet_that_could_place_it():
    p = decide(snap(make_host("h1", ready=False)), [make_request("r", gpus_per_node=8)])
    (d,) = p.decisions
    assert isinstance(d, Wait)


def test_quota_narrowed_to_a_model_makes_work_wait_with_usage_in_words():
    tenants = [TenantView(tenant_id="t1", quotas=(QuotaRule(max_gpus=8, gpu_model="H100"),))]
    s = snap(
        make_host("h1"),
        make_host("h2"),
        allocs=[alloc("run", "h1", range(8), tenant_id="t1")],
        tenants=tenants,
    )
    p = decide(s, [make_request("r", gpus_per_node=1)])
    assert p.decisions == (Wait("r", "quota: 8 of 8 H100 GPUs in use and this needs 1 more"),)


def test_a_burst_of_requests_never_takes_a_tenant_past_its_quota():
    tenants = [TenantView(tenant_id="t1", quotas=(QuotaRule(max_gpus=3, max_instances=10),))]
    s = snap(make_host("h1"), tenants=tenants)
    queue = [make_request(f"r{i}", submitted_at=i) for i in range(6)]
    p = decide(s, queue)
    assert len(p.places) == 3
    assert all(w.reason == "quota: 3 of 3 GPUs in use and this needs 1 more" for w in p.waits)


def test_a_request_bigger_than_its_quota_is_rejected():
    tenants = [TenantView(tenant_id="t1", quotas=(QuotaRule(max_gpus=4),))]
    p = decide(snap(make_host("h1"), tenants=tenants), [make_request("r", gpus_per_node=8)])
    assert isinstance(p.decisions[0], Reject)
    assert "quota allows 4" in p.decisions[0].reason


def test_region_quota_steers_region_free_work_to_other_regions():
    tenants = [TenantView(tenant_id="t1", quotas=(QuotaRule(max_gpus=0, region="r1"),))]
    s = snap(make_host("a", region="r1"), make_host("b", region="r2"), tenants=tenants)
    p = decide(s, [make_request("r")])
    (d,) = p.places
    assert d.placements[0].host_id == "b"


def test_a_spent_budget_admits_nothing_new():
    tenants = [TenantView(tenant_id="t1", budget_exhausted=True)]
    p = decide(snap(make_host("h1"), tenants=tenants), [make_request("r")])
    assert isinstance(p.decisions[0], Wait) and p.decisions[0].reason.startswith("A hard-stop budget is spent")
    # billing's cause, pushed down with the tenant, is the one the reason names
    tenants = [TenantView(tenant_id="t1", budget_exhausted=True, blocker=Blocker("insufficient_credit"))]
    p = decide(snap(make_host("h1"), tenants=tenants), [make_request("r")])
    assert p.decisions[0].reason.startswith("Your balance is used up: add credit to launch.")


# ---------------------------------------------------------------------- placement


def test_multi_gpu_request_gets_gpus_on_one_nvlink_island():
    h = make_host("h1", island_size=4, whole=[0, 1, 4])  # islands: {2,3} free, {5,6,7} free
    p = decide(snap(h), [make_request("r", gpus_per_node=3)])
    (d,) = p.places
    assert d.placements[0].gpus == ("h1-g5", "h1-g6", "h1-g7")


def test_wait_reason_names_the_nvlink_constraint_and_the_queue_ahead():
    # 4 free GPUs, but 2 + 2 on two islands
    h = make_host("h1", island_size=4, whole=[0, 1, 4, 5])
    queue = [make_request(f"r{i}", gpus_per_node=4, submitted_at=i) for i in range(4)]
    p = decide(snap(h), queue)
    reasons = [w.reason for w in p.waits]
    assert reasons[0] == "no host has 4 free H100 GPUs on one NVLink island"
    assert (
        reasons[3] == "no host has 4 free H100 GPUs on one NVLink island; 3 requests ahead of you"
    )


def test_prefer_topology_lets_a_request_span_islands():
    h = make_host("h1", island_size=4, whole=[0, 1, 4, 5])
    pol = get_policy("gpucloud").with_(topology="prefer")
    p = decide(snap(h), [make_request("r", gpus_per_node=4)], pol)
    assert len(p.places) == 1


def test_binpacking_fills_the_fullest_host_first():
    s = snap(make_host("empty"), make_host("busy", whole=range(6)))
    p = decide(s, [make_request("r", gpus_per_node=2)], "best-fit-test" if False else "gpucloud")
    assert p.places[0].placements[0].host_id == "busy"


def test_spread_placement_prefers_empty_and_idle_hosts():
    s = snap(make_host("a", whole=range(4), util=0.9), make_host("b", util=0.1))
    pol = get_policy("gpucloud").with_(placement="spread")
    p = decide(s, [make_request("r")], pol)
    assert p.places[0].placements[0].host_id == "b"


def test_one_cycle_never_books_a_gpu_twice():
    s = snap(make_host("h1", gpus=4))
    queue = [make_request(f"r{i}", submitted_at=i) for i in range(6)]
    p = decide(s, queue)
    used = [u for d in p.places for pl in d.placements for u in pl.gpus]
    assert len(used) == len(set(used)) == 4
    assert len(p.waits) == 2


def test_cpu_and_memory_limit_placement_and_show_in_the_reason():
    s = snap(make_host("h1", vcpus=16))
    queue = [make_request("a", vcpus=12), make_request("b", vcpus=8, submitted_at=1)]
    p = decide(s, queue)
    assert [type(d) for d in p.decisions] == [Place, Wait]
    assert "8 vCPUs" in p.waits[0].reason


def test_fractional_shares_pack_onto_one_gpu_and_never_exceed_it():
    s = snap(make_host("h1", gpus=2))
    queue = [
        make_request(f"r{i}", gpus_per_node=0, gpu_milli=250, submitted_at=i) for i in range(9)
    ]
    p = decide(s, queue)
    gpus = [d.placements[0].gpus[0] for d in p.places]
    assert len(p.places) == 8
    assert gpus.count("h1-g0") == 4 and gpus.count("h1-g1") == 4


def test_whole_and_fractional_work_never_share_a_gpu():
    s = snap(make_host("h1", gpus=2, shares={0: 250}))
    queue = [make_request("w", gpus_per_node=2), make_request("s", gpus_per_node=1)]
    p = decide(s, queue)
    assert isinstance(p.decision_for("w"), Wait)
    placed = p.decision_for("s")
    assert isinstance(placed, Place) and placed.placements[0].gpus == ("h1-g1",)


def test_frag_aware_puts_a_share_where_it_strands_the_least():
    # a GPU with 250 free takes a 250 share exactly instead of breaking a fresh GPU
    s = snap(make_host("a", gpus=8, shares={0: 750}), make_host("b", gpus=8))
    queue = [make_request("s", gpus_per_node=0, gpu_milli=250)]
    p = decide(s, queue)
    assert p.places[0].placements == (HostPlacement("a", ("a-g0",), 250),)


def test_multi_host_gang_is_all_or_nothing():
    s = snap(make_host("h1"), make_host("h2", whole=[0]))
    p = decide(s, [make_request("g", gpus_per_node=8, nodes=2)])
    assert isinstance(p.decisions[0], Wait)
    s2 = snap(make_host("h1"), make_host("h2"), make_host("h3", region="r2"))
    p2 = decide(s2, [make_request("g", gpus_per_node=8, nodes=2)])
    assert {pl.host_id for pl in p2.places[0].placements} == {"h1", "h2"}


def test_gang_stays_in_one_region():
    s = snap(make_host("a", region="r1"), make_host("b", region="r2"))
    p = decide(s, [make_request("g", gpus_per_node=8, nodes=2)])
    assert isinstance(p.decisions[0], Wait)


# ---------------------------------------------------------------------- queue order


def test_higher_class_goes_first_even_if_younger():
    s = snap(make_host("h1", gpus=1))
    queue = [
        make_request("old-low", priority="low", submitted_at=0),
        make_request("new-critical", priority="critical", submitted_at=100),
    ]
    p = decide(s, queue, get_policy("gpucloud").with_(preemption=False))
    assert p.places[0].request_id == "new-critical"


def test_weighted_fair_share_alternates_between_tenants():
    s = snap(make_host("h1", gpus=4))
    queue = [make_request(f"a{i}", tenant_id="a", submitted_at=i) for i in range(4)]
    queue += [make_request(f"b{i}", tenant_id="b", submitted_at=10 + i) for i in range(4)]
    p = decide(s, queue)
    assert sorted(d.request_id for d in p.places) == ["a0", "a1", "b0", "b1"]


def test_a_heavier_weight_gets_a_proportionally_bigger_share():
    tenants = [TenantView(tenant_id="a", weight=3), TenantView(tenant_id="b", weight=1)]
    s = snap(make_host("h1", gpus=8), tenants=tenants)
    queue = [make_request(f"a{i}", tenant_id="a", submitted_at=i) for i in range(8)]
    queue += [make_request(f"b{i}", tenant_id="b", submitted_at=i) for i in range(8)]
    p = decide(s, queue)
    owners = [d.request_id[0] for d in p.places]
    assert owners.count("a") == 6 and owners.count("b") == 2


@pytest.mark.parametrize(
    ("policy", "first"),
    [("fifo", "old"), ("sjf", "short"), ("srtf", "mostly-done"), ("las", "fresh")],
)
def test_oracle_and_service_orders(policy, first):  # type: ignore[no-untyped-def]
    s = snap(make_host("h1", gpus=1))
    queue = [
        make_request("old", submitted_at=0, expected_duration=9000, attained_service=7200),
        make_request("short", submitted_at=5, expected_duration=60),
        make_request("mostly-done", submitted_at=6, expected_duration=3000, attained_service=2990),
        make_request("fresh", submitted_at=4, expected_duration=5000),
    ]
    p = decide(s, queue, policy)
    assert p.places[0].request_id == first


def test_fifo_blocks_behind_its_head():
    s = snap(make_host("h1", whole=range(6)))
    queue = [make_request("big", gpus_per_node=4), make_request("small", submitted_at=1)]
    p = decide(s, queue, "fifo")
    assert p.decision_for("small") == Wait(
        "small", "waiting behind an earlier H100 request; 1 request ahead of you"
    )


def test_fifo_head_pinned_to_one_region_does_not_block_another_region():
    s = snap(make_host("a1", region="a", whole=range(6)), make_host("b1", region="b"))
    queue = [
        make_request("big", gpus_per_node=4, region="a"),
        make_request("small", region="b", submitted_at=1),
        make_request("behind", region="a", submitted_at=2),
    ]
    p = decide(s, queue, "fifo")
    assert isinstance(p.decision_for("small"), Place)
    assert isinstance(p.decision_for("behind"), Wait)


# ---------------------------------------------------------------------- preemption


def test_critical_work_preempts_spot_first_then_the_shortest_running():
    s = snap(
        make_host("h1", gpus=2),
        allocs=[
            alloc("od-young", "h1", [0], priority="low", started_at=NOW - 60),
            alloc("spot-old", "h1", [1], priority="low", billing="spot", started_at=NOW - 9000),
        ],
    )
    p = decide(s, [make_request("c", priority="critical")])
    assert p.preempts == (
        Preempt(
            "spot-old",
            "c",
            30.0,
            "preempted to make room for critical-class work",
        ),
    )
    assert p.decision_for("c") == Wait("c", "waiting for 1 preempted instance to stop")


def test_preemption_takes_the_least_work_lost_among_equal_billing():
    s = snap(
        make_host("h1", gpus=2),
        allocs=[
            alloc("long", "h1", [0], priority="low", started_at=NOW - 9000),
            alloc("short", "h1", [1], priority="low", started_at=NOW - 60),
        ],
    )
    p = decide(s, [make_request("c", priority="critical")])
    assert [x.victim_id for x in p.preempts] == ["short"]


def test_victims_already_under_notice_are_not_preempted_twice():
    s = snap(
        make_host("h1", gpus=2),
        allocs=[
            alloc(
                "v1",
                "h1",
                [0, 1],
                priority="low",
                preempting=True,
                preempting_for="c",
                stop_by=NOW + 10,
            ),
        ],
    )
    p = decide(s, [make_request("c", priority="critical", gpus_per_node=2)])
    assert p.preempts == ()
    assert p.decision_for("c") == Wait("c", "waiting for 1 preempted instance to stop")


def test_preemption_never_touches_the_same_or_a_higher_class():
    s = snap(make_host("h1", gpus=1), allocs=[alloc("std", "h1", [0], priority="standard")])
    p = decide(s, [make_request("s", priority="standard")])
    assert p.preempts == ()
    assert isinstance(p.decision_for("s"), Wait)


def test_static_mode_never_preempts():
    s = snap(make_host("h1", gpus=1), allocs=[alloc("low", "h1", [0], priority="low")])
    pol = get_policy("priority").with_(mode="static")
    p = decide(s, [make_request("c", priority="critical")], pol)
    assert p.preempts == ()


def test_hybrid_mode_protects_static_classes():
    pol = get_policy("gpucloud")  # critical static, standard and low dynamic
    s = snap(make_host("h1", gpus=1), allocs=[alloc("crit", "h1", [0], priority="critical")])
    # nothing can preempt critical work
    assert decide(s, [make_request("x", priority="critical")], pol).preempts == ()
    s2 = snap(make_host("h1", gpus=1), allocs=[alloc("std", "h1", [0], priority="standard")])
    assert [
        x.victim_id for x in decide(s2, [make_request("c", priority="critical")], pol).preempts
    ] == ["std"]


def test_preemption_frees_a_whole_island_for_a_multi_gpu_request():
    s = snap(
        make_host("h1", gpus=8, island_size=4),
        allocs=[alloc(f"low{i}", "h1", [i], priority="low", started_at=NOW - i) for i in range(8)],
    )
    p = decide(s, [make_request("c", priority="critical", gpus_per_node=4)])
    victims = sorted(x.victim_id for x in p.preempts)
    assert len(victims) == 4
    islands = {int(v[3:]) // 4 for v in victims}
    assert len(islands) == 1


# ---------------------------------------------------------------------- backfill


def backfill_scene():  # type: ignore[no-untyped-def]
    # h1: 8 GPUs, 6 busy until NOW+1000; h2 fully busy forever
    s = snap(
        make_host("h1"),
        make_host("h2"),
        allocs=[
            alloc("a", "h1", range(6), expected_end=NOW + 1000),
            alloc("b", "h2", range(8)),
        ],
    )
    head = make_request("head", gpus_per_node=8, submitted_at=0)
    return s, head


def test_backfill_starts_short_work_that_ends_before_the_reservation():
    s, head = backfill_scene()
    short = make_request("short", gpus_per_node=2, expected_duration=500, submitted_at=1)
    p = decide(s, [head, short], get_policy("gpucloud").with_(preemption=False))
    assert isinstance(p.decision_for("head"), Wait)
    placed = p.decision_for("short")
    assert isinstance(placed, Place) and placed.backfilled


def test_backfill_holds_back_work_that_would_delay_the_head():
    s, head = backfill_scene()
    long = make_request("long", gpus_per_node=2, expected_duration=5000, submitted_at=1)
    unknown = make_request("unknown", gpus_per_node=2, submitted_at=2)
    p = decide(s, [head, long, unknown], get_policy("gpucloud").with_(preemption=False))
    assert isinstance(p.decision_for("long"), Wait)
    assert (
        "reserved for an earlier request (starting in 1000 s)" in p.decision_for("unknown").reason
    )  # type: ignore[union-attr]


def test_the_reservation_counts_work_placed_earlier_in_the_same_plan():
    # "first" takes half of the empty host; the head needs all of it, so it can start when
    # "first" ends. Short work fits in that hole now; open-ended work would delay the head.
    s = snap(make_host("h1"))
    first = make_request("first", gpus_per_node=4, expected_duration=1000, submitted_at=0)
    head = make_request("head", gpus_per_node=8, submitted_at=1)
    short = make_request("short", gpus_per_node=2, expected_duration=500, submitted_at=2)
    unknown = make_request("unknown", gpus_per_node=2, submitted_at=3)
    queue = [first, head, short, unknown]
    pol = get_policy("gpucloud").with_(preemption=False)
    p = decide(s, queue, pol)
    assert isinstance(p.decision_for("first"), Place)
    assert isinstance(p.decision_for("head"), Wait)
    placed = p.decision_for("short")
    assert isinstance(placed, Place) and placed.backfilled
    assert "reserved for an earlier request (starting in 1000 s)" in p.decision_for("unknown").reason  # type: ignore[union-attr]
    # The next cycle sees the placements as allocations and has nothing more to start:
    # one cycle did the whole work, and the reservation did not move.
    ran = [
        alloc(d.request_id, "h1", [int(u.rsplit("g", 1)[1]) for u in d.placements[0].gpus],
              expected_end=NOW + r.expected_duration, started_at=NOW)
        for r in queue
        if isinstance(d := p.decision_for(r.request_id), Place)
    ]
    waiting = [r for r in queue if isinstance(p.decision_for(r.request_id), Wait)]
    again = decide(occupy(s, ran), waiting, pol)
    assert not any(isinstance(d, Place) for d in again.decisions)


def test_without_backfill_other_work_may_jump_ahead():
    s, head = backfill_scene()
    long = make_request("long", gpus_per_node=2, expected_duration=5000, submitted_at=1)
    pol = get_policy("gpucloud").with_(preemption=False, backfill=False)
    p = decide(s, [head, long], pol)
    assert isinstance(p.decision_for("long"), Place)


# ---------------------------------------------------------------------- dynamic mode


def test_idle_dynamic_work_is_reclaimed_while_others_wait():
    s = snap(
        make_host("h1", gpus=1, util=0.01, idle_since=NOW - 7200),
        allocs=[alloc("idle", "h1", [0], priority="standard")],
    )
    p = decide(s, [make_request("w", priority="standard")])
    (pre,) = p.preempts
    assert pre.victim_id == "idle" and pre.because_request_id is None
    assert pre.reason.startswith("reclaimed: GPUs below 5% utilisation for 2.0 h")


def test_idle_work_is_not_reclaimed_without_demand_or_in_static_classes():
    s = snap(
        make_host("h1", gpus=2, util=0.0, idle_since=NOW - 7200),
        allocs=[alloc("idle", "h1", [0], priority="standard")],
    )
    assert decide(s, []).preempts == ()
    s2 = snap(
        make_host("h1", gpus=1, util=0.0, idle_since=NOW - 7200),
        allocs=[alloc("idle", "h1", [0], priority="critical")],
    )
    assert decide(s2, [make_request("w")]).preempts == ()


def test_defrag_suggests_moving_lonely_restartable_work():
    s = snap(
        make_host("a"),
        make_host("b"),
        allocs=[
            alloc("lonely", "a", [0], priority="low", restartable=True),
            alloc("anchor", "b", range(4), priority="low"),
        ],
    )
    pol = get_policy("gpucloud").with_(defrag=True)
    p = decide(s, [], pol)
    (m,) = p.migrations
    assert isinstance(m, Migrate) and m.to[0].host_id == "b"


# ---------------------------------------------------------------------- policies


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_preset_plans_a_mixed_queue_within_the_invariants(name):  # type: ignore[no-untyped-def]
    s = snap(
        make_host("h1"),
        make_host("h2", model="A100", region="r2", island_size=4),
        allocs=[alloc("run", "h1", [0, 1], priority="low", expected_end=NOW + 100)],
    )
    queue = [
        make_request("a", gpus_per_node=2, priority="critical"),
        make_request("b", gpus_per_node=0, gpu_milli=500, gpu_model="A100"),
        make_request("c", gpus_per_node=8, expected_duration=100),
        make_request("d", gpus_per_node=4, gpu_model="A100", region="r2", tenant_id="t2"),
        make_request("e", gpus_per_node=1, priority="low", billing="spot"),
    ]
    p = decide(s, queue, name)
    assert p.policy == name
    assert p.counters.placed == len(p.places) >= 2


def test_same_input_gives_the_same_plan():
    s, head = backfill_scene()
    queue = [head] + [
        make_request(f"r{i}", submitted_at=i, tenant_id=f"t{i % 3}") for i in range(5)
    ]
    assert plan(s, queue, "gpucloud", now=NOW) == plan(
        s, list(reversed(queue)), "gpucloud", now=NOW
    )
