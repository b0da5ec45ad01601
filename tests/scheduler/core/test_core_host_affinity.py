"""Host affinity (volumes): work pinned to a host is only ever placed there, or waits there."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from scheduler.core import (
    Allocation,
    ClusterSnapshot,
    HostPlacement,
    Migrate,
    Place,
    PlacementRequest,
    Preempt,
    Wait,
    plan,
)
from scheduler.core.testing import apply_plan, make_host, make_request, occupy, verify
from tests.scheduler.core.test_core_properties import NOW, fleets, policies, requests


@st.composite
def pinned_queues(draw: st.DrawFn) -> tuple[object, list[PlacementRequest], dict[str, str]]:
    s = draw(fleets())
    queue = draw(requests())
    hosts = [h.host_id for h in s.hosts] + ["gone"]  # a host the snapshot does not have
    pins: dict[str, str] = {}
    out = []
    for r in queue:
        if draw(st.booleans()):
            host = draw(st.sampled_from(hosts))
            pins[r.request_id] = host
            r = replace(r, pinned_host=host, pinned_because="where volume v lives", nodes=1,
                        restartable=draw(st.booleans()))
        out.append(r)
    return s, out, pins


@given(pinned_queues(), policies())
def test_pinned_work_is_only_ever_placed_on_its_host(case, pol):  # type: ignore[no-untyped-def]
    s, queue, pins = case
    snapshot = s
    for _cycle in range(3):  # and in the cycles after: preemptions end, work is requeued
        p = plan(snapshot, queue, pol, now=NOW)
        verify(snapshot, queue, p)
        for d in p.decisions:
            if isinstance(d, Place) and d.request_id in pins:
                assert [pl.host_id for pl in d.placements] == [pins[d.request_id]]
            if isinstance(d, Migrate):
                assert d.request_id not in pins
        snapshot, queue = apply_plan(snapshot, queue, p, now=NOW)
        pinned_running = {a.request_id for a in snapshot.allocations if a.request_id in pins}
        for a in snapshot.allocations:
            if a.request_id in pinned_running:
                assert {pl.host_id for pl in a.placements} == {pins[a.request_id]}


def test_a_pinned_request_waits_for_its_host_with_the_reason_in_words() -> None:
    s = occupy(ClusterSnapshot(hosts=(make_host("a", gpus=2), make_host("b", gpus=2))), (_busy_a(),))
    req = make_request("r", gpus_per_node=2, pinned_host="a", pinned_because="where volume data lives")
    p = plan(s, [req], "fifo", now=NOW)
    d = p.decision_for("r")
    assert isinstance(d, Wait)
    assert d.reason.startswith("waiting for host a, where volume data lives, to have 2 free H100 GPUs")
    # the other host had room all along; unpinned, the same request goes there
    free = plan(s, [replace(req, pinned_host=None)], "fifo", now=NOW).decision_for("r")
    assert isinstance(free, Place) and free.placements[0].host_id == "b"
    assert not any(isinstance(x, Preempt) for x in p.decisions)


def _busy_a() -> Allocation:
    return Allocation(request_id="busy", tenant_id="t2", placements=(HostPlacement("a", ("a-g0", "a-g1")),),
                      gpu_model="H100", started_at=NOW - 10)
