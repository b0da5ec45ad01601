"""The victim search's written-out rule (``preemption.evictable``, with each running
work's time-slice key worked out once per cycle) answers exactly what ``can_evict``
answered before it, for every class, key and kind of running work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import Allocation, ClusterSnapshot, HostPlacement, get_policy
from scheduler.core.planner.cycle import CycleState
from scheduler.core.planner.preemption import can_evict, evictable, service_queue
from scheduler.core.state import INF, AllocState
from scheduler.core.testing import make_host, occupy

NOW = 100_000.0


def reference(cycle: CycleState, a: AllocState, rank: int, mine: float) -> bool:
    """``can_evict`` as it was written before the per-cycle keys."""
    if a.doomed or not cycle.dynamic.get(a.alloc.priority, False):
        return False
    if a.rank > rank:
        return True
    if a.rank < rank or mine == INF:
        return False
    al = a.alloc
    policy = cycle.policy
    if (
        al.kind != "job"
        or not al.restartable
        or not al.checkpointable
        or NOW - al.started_at < cycle.slice_quantum.get(al.priority, policy.min_run_s)
    ):
        return False
    if policy.time_slice == "las":
        return service_queue(cycle, a) > mine
    return al.expected_end is not None and al.expected_end - NOW > mine


@st.composite
def running_work(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[bool]]:
    allocs = []
    doomed = []
    for i in range(draw(st.integers(1, 8))):
        allocs.append(
            Allocation(
                request_id=f"r{i}",
                tenant_id="t",
                gpu_model="H100",
                placements=(HostPlacement("h0", (f"h0-g{i}",)),),
                priority=draw(st.sampled_from(("critical", "standard", "low"))),
                billing=draw(st.sampled_from(("on_demand", "spot"))),
                kind=draw(st.sampled_from(("job", "job", "instance"))),
                restartable=draw(st.booleans()),
                checkpointable=draw(st.booleans()),
                started_at=NOW - draw(st.sampled_from((10.0, 900.0, 5000.0, 50_000.0))),
                expected_end=draw(st.sampled_from((None, NOW + 50.0, NOW + 5000.0, NOW + 80_000.0))),
                attained_service=draw(st.sampled_from((0.0, 3000.0, 40_000.0))),
            )
        )
        doomed.append(draw(st.booleans()))
    return occupy(ClusterSnapshot(hosts=(make_host("h0", gpus=8),)), allocs), doomed


@settings(max_examples=200, deadline=None)
@given(
    case=running_work(),
    policy=st.sampled_from(("srtf", "las", "gpucloud", "fifo")),
    probes=st.lists(
        st.tuples(
            st.integers(0, 2), st.sampled_from((-INF, 0.0, 1.0, 2.0, 100.0, 4000.0, 60_000.0, INF))
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_the_written_out_rule_evicts_what_can_evict_did(case, policy, probes):  # type: ignore[no-untyped-def]
    snap, doomed = case
    pol = get_policy(policy).with_(las_thresholds=(2000.0, 20_000.0))
    cycle = CycleState(snap, [], pol, NOW)
    allocs = list(cycle.fleet.allocs.values())
    for a, d in zip(allocs, doomed, strict=True):
        a.doomed = d
    for rank, mine in probes:
        expected = [a for a in allocs if reference(cycle, a, rank, mine)]
        assert evictable(cycle, allocs, rank, mine) == expected
        assert evictable(cycle, allocs, rank, mine, first=True) == expected[:1]
        assert [a for a in allocs if can_evict(cycle, a, rank, mine)] == expected
