"""Bounded blast radius, least lost work, checkpointing victims and time-slicing in
the core's victim selection (Policy.preempt_cap, Policy.time_slice, Policy.slice_quantum)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from test_core_properties import NOW, fleets, requests

from scheduler.core import (
    WHOLE,
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    Place,
    PlacementRequest,
    Preempt,
    Wait,
    get_policy,
    plan,
)
from scheduler.core.testing import make_host, make_request, occupy, verify


def snap(*hosts, allocs=()):  # type: ignore[no-untyped-def]
    s = ClusterSnapshot(hosts=tuple(hosts))
    return occupy(s, list(allocs)) if allocs else s


def alloc(rid, host, gpus, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("tenant_id", "t9")
    kw.setdefault("gpu_model", "H100")
    kw.setdefault("priority", "low")
    return Allocation(
        request_id=rid,
        placements=(HostPlacement(host, tuple(f"{host}-g{i}" for i in gpus)),),
        **kw,
    )


def held_milli(a: Allocation) -> int:
    return sum(len(p.gpus) * p.milli for p in a.placements)


def over_cap(req: PlacementRequest, victims: list[Allocation], cap: float, now: float) -> str:
    """Brute force, from the definition: "" when evicting ``victims`` for ``req``
    stays within ``cap`` times what it needs, else why not."""
    need_gpus = req.total_milli / WHOLE
    d = req.expected_duration
    if d is not None and all(v.expected_end is not None for v in victims):
        cost = sum(held_milli(v) / WHOLE * max(0.0, v.expected_end - now) for v in victims)  # type: ignore[operator]
        bound = cap * need_gpus * d
        unit = "GPU-s"
    else:
        cost = sum(held_milli(v) for v in victims) / WHOLE
        bound = cap * need_gpus
        unit = "GPUs"
    return "" if cost <= bound + 1e-6 else f"{cost} {unit} > {bound}"


# ---------------------------------------------------------------------- the property


@given(
    fleets(max_hosts=4),
    requests(max_n=8),
    st.sampled_from((1.0, 1.0, 1.5, 2.0, 4.0)),
    st.sampled_from(("priority", "gpucloud")),
)
def test_a_preemption_never_evicts_more_than_the_cap(s, queue, cap, name):  # type: ignore[no-untyped-def]
    pol = get_policy(name).with_(topology="prefer", preempt_cap=cap)
    p = plan(s, queue, pol, now=NOW)
    verify(s, queue, p)
    by_id = {a.request_id: a for a in s.allocations}
    reqs = {r.request_id: r for r in queue}
    victims: dict[str, list[Allocation]] = {}
    for d in p.preempts:
        if d.because_request_id is not None:
            victims.setdefault(d.because_request_id, []).append(by_id[d.victim_id])
    for rid, vs in victims.items():
        assert not over_cap(reqs[rid], vs, cap, NOW), over_cap(reqs[rid], vs, cap, NOW)
    # a reclaim (because=None) never frees more than the cap times the waiting demand
    reclaimed = [by_id[d.victim_id] for d in p.preempts if d.because_request_id is None]
    for model in {a.gpu_model for a in reclaimed}:
        waiting = sum(
            reqs[w.request_id].total_milli
            for w in p.waits
            if reqs[w.request_id].gpu_model == model
        )
        assert sum(held_milli(a) for a in reclaimed if a.gpu_model == model) <= cap * waiting


@given(fleets(max_hosts=4), st.sampled_from(("critical", "standard")), st.data())
def test_a_higher_class_waiting_on_the_cap_says_so(s, cls, data):  # type: ignore[no-untyped-def]
    g = data.draw(st.sampled_from((1, 2, 4)))
    req = make_request("hi", gpu_model=data.draw(st.sampled_from(("H100", "A100"))),
                       gpus_per_node=g, priority=cls)
    pol = get_policy("priority").with_(topology="prefer")
    p = plan(s, [req], pol, now=NOW)
    unbounded = plan(s, [req], pol.with_(preempt_cap=math.inf), now=NOW)
    d = p.decision_for("hi")
    if isinstance(d, Wait) and not p.preempts and unbounded.preempts:
        assert "over the cap of 1x" in d.reason, d.reason


# ---------------------------------------------------------------------- scenarios


def test_one_gpu_never_evicts_an_eight_gpu_job_by_default():
    s = snap(make_host("h1", gpus=8), allocs=[alloc("big", "h1", range(8))])
    p = plan(s, [make_request("c", priority="critical")], "gpucloud", now=NOW)
    assert p.preempts == ()
    (w,) = p.waits
    assert w.reason.endswith(
        "preempting for it would evict 8 GPUs of running work, over the cap of 1x the 1 GPU it asks for"
    )
    # an operator who accepts a larger blast radius raises the cap
    wide = get_policy("gpucloud").with_(preempt_cap=8.0)
    assert [x.victim_id for x in plan(s, [make_request("c", priority="critical")], wide, now=NOW).preempts] == [
        "big"
    ]


def test_the_cap_picks_small_victims_over_a_large_one_that_lost_less():
    s = snap(
        make_host("h1", gpus=4),
        allocs=[
            # the least work lost, but evicting it evicts 3 GPUs for a 1-GPU request
            alloc("wide", "h1", [0, 1, 2], started_at=NOW - 10, checkpointable=True),
            alloc("narrow", "h1", [3], started_at=NOW - 5000),
        ],
    )
    p = plan(s, [make_request("c", priority="critical")], "gpucloud", now=NOW)
    assert [x.victim_id for x in p.preempts] == ["narrow"]


def test_with_estimates_the_cap_counts_gpu_seconds_of_remaining_work():
    s = snap(make_host("h1", gpus=2), allocs=[alloc("two", "h1", [0, 1], expected_end=NOW + 1800)])
    # 1 GPU for 2 h needs 2 GPU-hours; evicting 2 GPUs with half an hour left costs 1 GPU-hour
    long = make_request("c", priority="critical", expected_duration=7200)
    assert [x.victim_id for x in plan(s, [long], "gpucloud", now=NOW).preempts] == ["two"]
    # 1 GPU for 10 min needs 1/6 GPU-hour: the same eviction is over the cap
    short = make_request("c", priority="critical", expected_duration=600)
    p = plan(s, [short], "gpucloud", now=NOW)
    assert p.preempts == ()
    assert "would evict 1.0 GPU-hours of remaining work, over the cap of 1x its 0.2 GPU-hours" in p.waits[0].reason


def test_checkpointing_victims_lose_no_work_so_they_go_first():
    s = snap(
        make_host("h1", gpus=2),
        allocs=[
            alloc("fresh", "h1", [0], started_at=NOW - 60),
            alloc("saves", "h1", [1], started_at=NOW - 9000, checkpointable=True, grace_s=120.0),
        ],
    )
    p = plan(s, [make_request("c", priority="critical")], "gpucloud", now=NOW)
    # and its notice is its grace (longer than the policy's 30 s): time to save
    assert p.preempts == (
        Preempt("saves", "c", 120.0, "preempted to make room for critical-class work"),
    )


def test_spot_still_goes_before_on_demand_work_that_checkpoints():
    s = snap(
        make_host("h1", gpus=2),
        allocs=[
            alloc("spot", "h1", [0], billing="spot", started_at=NOW - 9000),
            alloc("saves", "h1", [1], checkpointable=True, grace_s=5.0),
        ],
    )
    p = plan(s, [make_request("c", priority="critical")], "gpucloud", now=NOW)
    assert [(x.victim_id, x.notice_s) for x in p.preempts] == [("spot", 30.0)]


def test_the_reclaim_never_frees_more_than_the_cap_times_what_waits():
    s = snap(
        make_host("h1", gpus=8, util=0.0, idle_since=NOW - 7200),
        allocs=[alloc("idle8", "h1", range(8), tenant_id="t2", priority="standard")],
    )
    queue = [make_request("w")]  # one GPU waits
    assert plan(s, queue, "gpucloud", now=NOW).preempts == ()
    wide = get_policy("gpucloud").with_(preempt_cap=8.0)
    assert [x.victim_id for x in plan(s, queue, wide, now=NOW).preempts] == ["idle8"]


def test_a_pinned_request_says_when_the_cap_holds_it_back():
    s = snap(make_host("h1", gpus=8), allocs=[alloc("big", "h1", range(8))])
    req = make_request("c", priority="critical", pinned_host="h1", pinned_because="where volume data lives")
    p = plan(s, [req], "gpucloud", now=NOW)
    assert p.preempts == ()
    assert "over the cap of 1x the 1 GPU it asks for" in p.waits[0].reason


# ---------------------------------------------------------------------- time-slicing


def sliced(quantum: float = 600.0, **kw):  # type: ignore[no-untyped-def]
    """gpucloud's least-attained-service time slicing with standard's own quantum."""
    kw.setdefault("time_slice", "las")
    return get_policy("gpucloud").with_(slice_quantum=(("standard", quantum),), **kw)


def batch(rid, host, gpus, **kw):  # type: ignore[no-untyped-def]
    """A running job that may be time-sliced: restartable batch work that checkpoints."""
    kw = {"priority": "standard", "kind": "job", "restartable": True, "checkpointable": True, **kw}
    return alloc(rid, host, gpus, **kw)


def job(rid, **kw):  # type: ignore[no-untyped-def]
    kw.setdefault("priority", "standard")
    kw.setdefault("submitted_at", NOW)  # young: the starvation guard lifts nothing
    return make_request(rid, kind="job", restartable=True, checkpointable=True, **kw)


def test_without_slicing_the_same_class_is_never_preempted():
    s = snap(make_host("h1", gpus=1), allocs=[
        batch("old", "h1", [0], started_at=NOW - 9000, attained_service=50_000.0)])
    req = job("new")
    assert plan(s, [req], sliced(), now=NOW).preempts != ()  # the scene can slice
    # a policy without time slicing preempts nothing of the request's own class
    assert plan(s, [req], sliced(time_slice=""), now=NOW).preempts == ()
    # nor does a class whose quantum never ends
    assert plan(s, [req], sliced(math.inf), now=NOW).preempts == ()
    # a lower class gets no turn on a higher class's work either
    assert plan(s, [job("lo", priority="low")], sliced(), now=NOW).preempts == ()


def test_same_class_work_is_preempted_only_after_its_quantum_and_when_it_had_more_service():
    def scene(ran: float, attained: float = 4000.0, **kw):  # type: ignore[no-untyped-def]
        # attained 4000 GPU-s + the run: the second LAS queue (3600..36000)
        return snap(make_host("h1", gpus=1), allocs=[
            batch("old", "h1", [0], started_at=NOW - ran, attained_service=attained, **kw)])

    req = job("new")  # no service yet: the first queue
    # inside its class's quantum (1800 s here, not min_run_s): it keeps running
    assert plan(scene(1200), [req], sliced(1800.0), now=NOW).preempts == ()
    assert plan(scene(1200), [req], sliced(600.0), now=NOW).preempts != ()
    # past it: the request in a lower attained-service queue takes its turn
    got = plan(scene(2000), [req], sliced(1800.0), now=NOW)
    assert [x.victim_id for x in got.preempts] == ["old"]
    assert isinstance(got.decision_for("new"), Wait)
    # a request that has had more service (the same queue or a later one) waits
    for attained in (5000.0, 40_000.0):
        more = job("new", attained_service=attained)
        assert plan(scene(2000), [more], sliced(1800.0), now=NOW).preempts == ()
    # running work still in the first queue is not sliced for a first-queue request
    assert plan(scene(2000, attained=0.0), [req], sliced(1800.0), now=NOW).preempts == ()
    # only checkpointing batch jobs are sliced: not one that restarts from scratch,
    assert plan(scene(2000, checkpointable=False), [req], sliced(1800.0), now=NOW).preempts == ()
    # and instances never, however long they ran
    inst = snap(make_host("h1", gpus=1), allocs=[
        alloc("rental", "h1", [0], priority="standard", started_at=NOW - 90_000,
              attained_service=90_000.0)])
    assert plan(inst, [req], sliced(), now=NOW).preempts == ()


def test_time_slicing_respects_the_cap_and_places_after_the_notice():
    s = snap(make_host("h1", gpus=2), allocs=[
        batch("old", "h1", [0, 1], started_at=NOW - 9000, attained_service=50_000.0)])
    p = plan(s, [job("new")], sliced(), now=NOW)
    assert p.preempts == ()  # 2 GPUs for a 1-GPU request
    why = p.decision_for("new")
    assert isinstance(why, Wait) and "over the cap of 1x" in why.reason
    p2 = plan(s, [job("new", gpus_per_node=2)], sliced(), now=NOW)
    assert [x.victim_id for x in p2.preempts] == ["old"]
    assert isinstance(p2.decision_for("new"), Wait)
    assert not isinstance(p2.decision_for("new"), Place)
