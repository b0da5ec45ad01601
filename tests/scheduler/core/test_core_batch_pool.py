"""Batch pools (issue 28): a pool's jobs run only on the hosts of the pool's members
(Azure Batch's semantics), or wait for a member with that reason; other work is untouched."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import Allocation, ClusterSnapshot, HostPlacement, Place, Wait, plan
from scheduler.core.testing import apply_plan, make_host, make_request, occupy, verify
from tests.scheduler.core.test_core_properties import NOW, fleets, policies, requests


def fleet() -> ClusterSnapshot:
    return ClusterSnapshot(hosts=(make_host("a", gpus=2), make_host("b", gpus=2), make_host("c", gpus=2)))


def test_a_pool_job_goes_to_a_member_host_even_when_others_are_emptier() -> None:
    job = make_request("j", kind="job", pool="render", pool_hosts=frozenset({"c"}))
    d = plan(fleet(), [job], "fifo", now=NOW).decision_for("j")
    assert isinstance(d, Place) and [p.host_id for p in d.placements] == ["c"]
    # the same job outside a pool goes where the placement likes (the first host)
    free = plan(fleet(), [replace(job, pool="", pool_hosts=frozenset())], "fifo", now=NOW).decision_for("j")
    assert isinstance(free, Place) and free.placements[0].host_id == "a"


def test_without_a_running_member_the_job_waits_for_one_and_says_so() -> None:
    job = make_request("j", kind="job", pool="render", pool_hosts=frozenset())
    d = plan(fleet(), [job], "fifo", now=NOW).decision_for("j")
    assert isinstance(d, Wait)
    assert d.reason == "waiting for a member of batch pool render to run (its jobs run only on its members' hosts)"


def test_a_full_member_host_makes_the_job_wait_though_the_region_has_room() -> None:
    busy = Allocation(request_id="m", tenant_id="t1", placements=(HostPlacement("c", ("c-g0", "c-g1")),),
                      gpu_model="H100", started_at=NOW - 10)
    s = occupy(fleet(), (busy,))
    job = make_request("j", kind="job", pool="render", pool_hosts=frozenset({"c"}))
    other = make_request("o", kind="job")
    p = plan(s, [job, other], "fifo", now=NOW)
    d = p.decision_for("j")
    assert isinstance(d, Wait)
    assert d.reason.startswith("waiting for 1 free H100 GPU on the hosts of batch pool render's members (1 host)")
    # and the waiting pool job blocks nobody: other work still lands elsewhere
    assert isinstance(p.decision_for("o"), Place)


@st.composite
def pooled_queues(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    s = draw(fleets())
    hosts = [h.host_id for h in s.hosts]
    members = frozenset(draw(st.lists(st.sampled_from(hosts), max_size=3))) if hosts else frozenset()
    out = []
    for r in draw(requests()):
        if draw(st.booleans()):
            r = replace(r, pool="p", pool_hosts=members)
        out.append(r)
    return s, out, members


@given(pooled_queues(), policies())
def test_pool_jobs_are_only_ever_placed_on_member_hosts(case, pol):  # type: ignore[no-untyped-def]
    snapshot, queue, members = case
    pooled = {r.request_id for r in queue if r.pool}
    for _cycle in range(3):
        p = plan(snapshot, queue, pol, now=NOW)
        verify(snapshot, queue, p)
        for d in p.decisions:
            if isinstance(d, Place) and d.request_id in pooled:
                assert {pl.host_id for pl in d.placements} <= members
        snapshot, queue = apply_plan(snapshot, queue, p, now=NOW)
