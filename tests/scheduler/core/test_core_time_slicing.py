"""Time slicing (preemptive 2D-LAS and SRTF for restartable batch jobs), the
starvation guard, the per-cycle depth cap, and the simulator's restart model."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import (
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    get_policy,
    plan,
)
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
