"""Time slicing (preemptive 2D-LAS and SRTF for restartable batch jobs), the
starvation guard, the per-cycle depth cap, and the simulator's restart model."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import (
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    PlacementRequest,
    Wait,
    get_policy,
    plan,
)
from scheduler.core.planner import admission
from scheduler.core.queue import las_level, las_promote_at
from scheduler.core.testing import make_host, make_request, occupy, verify
from scheduler.sim.engine import Simulator
from scheduler.sim.trace import Job, Node

NOW = 100_000.0


def running(rid: str, host: str, gpus: int, **kw: object) -> Allocation:
    kw.setdefault("tenant_id", "t9")
    kw.setdefault("gpu_model", "H100")
    return Allocation(
        request_id=rid,
        placements=(HostPlacement(host, tuple(f"{host}-g{i}" for i in range(gpus))),),
        **kw,  # type: ignore[arg-type]
    )


def one_full_host(*allocs: Allocation) -> ClusterSnapshot:
    return occupy(ClusterSnapshot(hosts=(make_host("h1", gpus=1),)), list(allocs))


def preempted(policy: str, victim: Allocation, **req: object) -> list[str]:
    s = one_full_host(victim)
    queue = [make_request("new", submitted_at=NOW - 10, **req)]  # type: ignore[arg-type]
    p = plan(s, queue, policy, now=NOW)
    verify(s, queue, p)
    return [d.victim_id for d in p.preempts]


LONG_JOB = {
    "kind": "job",
    "restartable": True,
    "checkpointable": True,
    "started_at": NOW - 7200,
    "priority": "standard",
}


def test_las_preempts_a_job_in_a_lower_attained_service_queue_for_a_fresh_one():
    assert preempted("las", running("old", "h1", 1, **LONG_JOB), kind="job") == ["old"]  # type: ignore[arg-type]


def test_las_keeps_a_job_of_the_same_queue_and_one_inside_its_quantum():
    fresh = {**LONG_JOB, "started_at": NOW - 100}  # 100 GPU-s attained: first queue
    assert preempted("las", running("young", "h1", 1, **fresh)) == []  # type: ignore[arg-type]
    quantum = {**LONG_JOB, "started_at": NOW - 100, "attained_service": 50_000.0}
    assert preempted("las", running("q", "h1", 1, **quantum)) == []  # type: ignore[arg-type]
    # same queue as the requester: the requester's own attained service counts
    assert preempted("las", running("old", "h1", 1, **LONG_JOB), attained_service=7000.0) == []  # type: ignore[arg-type]


def test_time_slicing_never_touches_instances_nor_work_that_cannot_restart():
    for kw in ({"kind": "instance"}, {"restartable": False}, {"checkpointable": False}):
        a = running("r", "h1", 1, **{**LONG_JOB, **kw})  # type: ignore[arg-type]
        assert preempted("las", a) == []
        assert preempted("gpucloud", a) == []


def test_gpucloud_slices_batch_jobs_by_attained_service_but_never_critical_work():
    assert preempted("gpucloud", running("old", "h1", 1, **LONG_JOB)) == ["old"]  # type: ignore[arg-type]
    crit = {**LONG_JOB, "priority": "critical"}
    assert preempted("gpucloud", running("c", "h1", 1, **crit), priority="critical") == []  # type: ignore[arg-type]


def test_srtf_preempts_only_work_expected_to_run_longer():
    long = {**LONG_JOB, "expected_end": NOW + 5000}
    assert preempted("srtf", running("long", "h1", 1, **long), expected_duration=600.0) == ["long"]  # type: ignore[arg-type]
    # remaining time = expected duration - attained per GPU: 9000 - 8000 = 1000 < 5000
    got = preempted(
        "srtf", running("long", "h1", 1, **long), expected_duration=9000.0, attained_service=8000.0
    )  # type: ignore[arg-type]
    assert got == ["long"]
    assert preempted("srtf", running("long", "h1", 1, **long), expected_duration=6000.0) == []  # type: ignore[arg-type]


def test_the_starvation_guard_lifts_a_long_waiting_request_to_the_first_queue():
    pol = get_policy("las")
    r = make_request("r", kind="job", attained_service=40_000.0, submitted_at=0.0)
    assert las_level(pol, r, 1000.0) == 2
    at = las_promote_at(pol, r)
    assert at == max(pol.las_starve_s, pol.las_starve_factor * 40_000.0)
    assert las_level(pol, r, at - 1) == 2 and las_level(pol, r, at) == 0


def test_the_depth_cap_leaves_the_rest_unexamined_but_never_caps_placements():
    s = ClusterSnapshot(hosts=(make_host("h1", gpus=4),))
    queue = [make_request(f"p{i}", submitted_at=i) for i in range(4)]
    queue += [make_request(f"w{i}", gpus_per_node=2, submitted_at=10 + i) for i in range(5)]
    pol = get_policy("las").with_(max_waits=2)
    p = plan(s, queue, pol, now=NOW)
    verify(s, queue, p)
    assert sorted(d.request_id for d in p.places) == ["p0", "p1", "p2", "p3"]
    waits = {d.request_id: d.reason for d in p.waits}
    assert set(waits) == {f"w{i}" for i in range(5)}
    assert [k for k, v in waits.items() if v.startswith("not examined")] == ["w2", "w3", "w4"]


# ------------------------------------------------------------ simulated replays


def _trace(draw: st.DrawFn) -> list[Job]:
    n = draw(st.integers(4, 24))
    jobs = []
    for i in range(n):
        jobs.append(
            Job(
                f"j{i:02d}",
                float(draw(st.integers(0, 400))),
                float(draw(st.integers(1, 3000))),
                draw(st.sampled_from((1, 1, 2, 4, 8))),
                tenant=draw(st.sampled_from(("a", "b", "c"))),
            )
        )
    return jobs


@settings(max_examples=25, deadline=None)
@given(
    data=st.data(),
    policy=st.sampled_from(("las", "srtf", "gpucloud")),
    fraction=st.sampled_from((0.0, 0.5, 1.0)),
)
def test_replays_keep_capacity_and_checkpointed_progress(data, policy, fraction):  # type: ignore[no-untyped-def]
    jobs = _trace(data.draw)
    nodes = [Node(f"n{i}", "H100", 8, 1) for i in range(2)]
    pol = get_policy(policy).with_(min_run_s=30.0, las_thresholds=(200.0, 2000.0), notice_s=5.0)
    res = Simulator(nodes, [replace(j) for j in jobs], pol, checkpoint_fraction=fraction).run()
    # no capacity violation: per host, the GPUs held never exceed its 8
    events = []
    for r in res.runs:
        for h in r.hosts:
            events.append((r.start, 1, h, r.gpus))
            events.append((r.end, 0, h, -r.gpus))
    used: dict[str, int] = defaultdict(int)
    for _t, _k, h, d in sorted(events):
        used[h] += d
        assert 0 <= used[h] <= 8
    by_job = defaultdict(list)
    for r in res.runs:
        by_job[r.job_id].append(r)
    lost = 0.0
    for jid, js in res.jobs.items():
        assert js.end is not None, jid
        runs = sorted(by_job[jid], key=lambda r: r.start)
        # attained service only grows: it is the GPU-time of the preempted runs
        attained = 0.0
        for r in runs[:-1]:
            assert r.preempted
            before = attained
            attained += (r.end - r.start) * js.job.gpus
            assert attained >= before
        assert math.isclose(js.attained, attained, abs_tol=1e-6)
        last = runs[-1]
        if js.checkpoint:
            # resumed: the runs add up to the job's duration, nothing lost
            assert math.isclose(sum(r.end - r.start for r in runs), js.job.duration, abs_tol=1e-6)
            assert js.lost == 0.0
        else:
            # from scratch: the last run is the whole job, the earlier ones are lost
            assert math.isclose(last.end - last.start, js.job.duration, abs_tol=1e-6)
            assert math.isclose(js.lost, attained, abs_tol=1e-6)
        lost += js.lost
        assert js.checkpoint == (fraction == 1.0) or fraction == 0.5
    assert math.isclose(res.lost_gpu_s, lost, abs_tol=1e-6)


def test_a_waiting_fresh_job_preempts_a_long_runner_only_if_it_checkpoints():
    nodes = [Node("n0", "H100", 1, 1)]
    jobs = [Job("long", 0.0, 5000.0, 1, tenant="a"), Job("short", 1000.0, 100.0, 1, tenant="b")]
    pol = get_policy("las").with_(min_run_s=60.0, las_thresholds=(500.0,), notice_s=10.0)
    res = Simulator(nodes, [replace(j) for j in jobs], pol, checkpoint_fraction=1.0).run()
    s = res.jobs
    assert s["short"].end == 1110.0  # waits out the 10 s notice, runs 100 s
    assert s["long"].preemptions == 1
    assert s["long"].end == 5100.0  # resumed: 1010 s done, 3990 s left at 1110
    assert res.lost_gpu_s == 0.0
    # a job that would restart from scratch is never time-sliced
    res = Simulator(nodes, [replace(j) for j in jobs], pol, checkpoint_fraction=0.0).run()
    assert res.jobs["long"].preemptions == 0 and res.jobs["short"].end == 5100.0


@st.composite
def _sliced_fleets(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[PlacementRequest]]:
    """Full hosts of time-sliceable jobs (some checkpointing, some inside their
    quantum, with end times) and a queue of batch jobs with durations and
    attained service: every request searches for victims of its own class."""
    hosts = []
    allocs = []
    for h in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from((4, 8)))
        host = f"h{h}"
        hosts.append(make_host(host, gpus=gpus))
        used = 0
        while used < gpus:
            g = min(draw(st.sampled_from((1, 1, 2, 4))), gpus - used)
            started = NOW - draw(st.sampled_from((100.0, 900.0, 5000.0, 50_000.0)))
            allocs.append(
                Allocation(
                    request_id=f"r{h}-{used}",
                    tenant_id=draw(st.sampled_from(("a", "b"))),
                    gpu_model="H100",
                    placements=(
                        HostPlacement(host, tuple(f"{host}-g{i}" for i in range(used, used + g))),
                    ),
                    priority="standard",
                    kind="job",
                    restartable=True,
                    checkpointable=draw(st.sampled_from((True, True, False))),
                    started_at=started,
                    expected_end=NOW + draw(st.sampled_from((50.0, 500.0, 5000.0, 80_000.0))),
                    attained_service=draw(st.sampled_from((0.0, 3000.0, 40_000.0))),
                )
            )
            used += g
    queue = [
        make_request(
            f"q{i:02d}",
            tenant_id=draw(st.sampled_from(("a", "b"))),
            gpus_per_node=draw(st.sampled_from((1, 1, 2, 4, 8))),
            nodes=draw(st.sampled_from((1, 1, 1, 2))),
            kind="job",
            restartable=True,
            checkpointable=True,
            submitted_at=NOW - draw(st.sampled_from((10.0, 2000.0, 30_000.0))),
            expected_duration=draw(st.sampled_from((100.0, 1000.0, 6000.0, 60_000.0))),
            attained_service=draw(st.sampled_from((0.0, 0.0, 3000.0, 30_000.0))),
        )
        for i in range(draw(st.integers(1, 12)))
    ]
    return occupy(ClusterSnapshot(hosts=tuple(hosts)), allocs), queue


@settings(max_examples=150, deadline=None)
@given(
    case=_sliced_fleets(),
    policy=st.sampled_from(("srtf", "las", "gpucloud")),
    cap=st.sampled_from((1.0, 2.0, math.inf)),
)
def test_a_failed_victim_search_answers_later_slice_keys_exactly(case, policy, cap):  # type: ignore[no-untyped-def]
    """The planner remembers a failed victim search and answers any request at
    least as large with a time-slice key at least as late from it (under srtf
    every request has its own key). The plan is the one without the memory."""
    s, queue = case
    pol = get_policy(policy).with_(
        topology="prefer", preempt_cap=cap, max_waits=None, las_thresholds=(2000.0, 20_000.0)
    )
    fast = plan(s, queue, pol, now=NOW)
    verify(s, queue, fast)
    with patch.object(admission, "known_no_victims", lambda cycle, key, shape: None):
        slow = plan(s, queue, pol, now=NOW)
    # Every decision is the same. A Wait's words may differ, as they did before
    # the key became a dimension: the cap's remembered words for a second request
    # of the same shape, where a fresh search finds the hosts reserved (backfill)
    # for the first and says nothing of the cap.
    assert [_bare(d) for d in fast.decisions] == [_bare(d) for d in slow.decisions]
    assert fast.counters == slow.counters


def _bare(d: object) -> object:
    return Wait(d.request_id, "") if isinstance(d, Wait) else d


def test_under_srtf_one_failed_victim_search_serves_every_later_remaining_time():
    # one full host of short work: nothing runs longer than any waiting request
    short = {**LONG_JOB, "expected_end": NOW + 50.0}
    s = one_full_host(running("short", "h1", 1, **short))  # type: ignore[arg-type]
    queue = [
        make_request(f"q{i}", kind="job", submitted_at=NOW - 10, expected_duration=100.0 * (i + 1))
        for i in range(5)
    ]
    calls = []
    real = admission.find_victims

    def counting(cycle, req, pools, cap):  # type: ignore[no-untyped-def]
        calls.append(req.request_id)
        return real(cycle, req, pools, cap)

    with patch.object(admission, "find_victims", counting):
        p = plan(s, queue, "srtf", now=NOW)
    assert not p.preempts and len(p.waits) == 5
    assert calls == ["q0"]
