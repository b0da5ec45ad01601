"""Filters, scores and GPU pickers as tables (kube-scheduler plugin test style)."""

from __future__ import annotations

import pytest

from scheduler.core import FILTERS, MAX_SCORE, PLACEMENTS, SCORES, Code, CycleContext
from scheduler.core.plugins import (
    BatchPoolFilter,
    BestFitScore,
    FragScore,
    FreeGpusFilter,
    GpuModelFilter,
    LoadScore,
    MostAllocatedScore,
    NvlinkFilter,
    ReadyFilter,
    RegionFilter,
    ReservationFilter,
    ResourcesFilter,
    TopologyScore,
    pick_share,
    pick_whole,
)
from scheduler.core.state import HostRes, HostState
from scheduler.core.testing import make_host, make_request


def state(**kw) -> HostState:  # type: ignore[no-untyped-def]
    view = make_host("h1", **kw)
    return HostState(
        view,
        view.gpus[0].model,
        HostRes(view.free_vcpus, view.free_memory_mib, view.total_vcpus, view.total_memory_mib),
    )


@pytest.mark.parametrize(
    ("flt", "req", "host", "code"),
    [
        (ReadyFilter(), {}, {}, Code.OK),
        (ReadyFilter(), {}, {"ready": False}, Code.UNSCHEDULABLE),
        (GpuModelFilter(), {}, {}, Code.OK),
        (GpuModelFilter(), {"gpu_model": "A100"}, {}, Code.UNRESOLVABLE),
        (RegionFilter(), {"region": None}, {}, Code.OK),
        (RegionFilter(), {"region": "r1"}, {}, Code.OK),
        (RegionFilter(), {"region": "r2"}, {}, Code.UNRESOLVABLE),
        (FreeGpusFilter(), {"gpus_per_node": 8}, {}, Code.OK),
        (FreeGpusFilter(), {"gpus_per_node": 8}, {"whole": [0]}, Code.UNSCHEDULABLE),
        (FreeGpusFilter(), {"gpus_per_node": 16}, {}, Code.UNRESOLVABLE),
        (
            FreeGpusFilter(),
            {"gpus_per_node": 2},
            {"gpus": 2, "shares": {0: 100}},
            Code.UNSCHEDULABLE,
        ),
        (
            FreeGpusFilter(),
            {"gpus_per_node": 0, "gpu_milli": 500},
            {"gpus": 1, "shares": {0: 500}},
            Code.OK,
        ),
        (
            FreeGpusFilter(),
            {"gpus_per_node": 0, "gpu_milli": 500},
            {"gpus": 1, "shares": {0: 750}},
            Code.UNSCHEDULABLE,
        ),
        (
            FreeGpusFilter(),
            {"gpus_per_node": 0, "gpu_milli": 125},
            {"gpus": 1, "whole": [0]},
            Code.UNSCHEDULABLE,
        ),
        (ResourcesFilter(), {"vcpus": 128, "memory_mib": 1024}, {"vcpus": 128}, Code.OK),
        (ResourcesFilter(), {"vcpus": 129}, {"vcpus": 128}, Code.UNSCHEDULABLE),
        (ResourcesFilter(), {"memory_mib": 2048}, {"memory_mib": 1024}, Code.UNSCHEDULABLE),
        (
            NvlinkFilter(),
            {"gpus_per_node": 4},
            {"island_size": 4, "whole": [0, 4]},
            Code.UNSCHEDULABLE,
        ),
        (NvlinkFilter(), {"gpus_per_node": 3}, {"island_size": 4, "whole": [0, 4]}, Code.OK),
        (
            NvlinkFilter(),
            {"gpus_per_node": 8},
            {"island_size": 4},
            Code.OK,
        ),  # bigger than any island
        (NvlinkFilter(), {"gpus_per_node": 1}, {"island_size": 1}, Code.OK),
        # a batch pool's job: only the hosts of the pool's members; other work anywhere
        (BatchPoolFilter(), {}, {}, Code.OK),
        (BatchPoolFilter(), {"pool": "render", "pool_hosts": frozenset({"h1"})}, {}, Code.OK),
        (
            BatchPoolFilter(),
            {"pool": "render", "pool_hosts": frozenset({"h2"})},
            {},
            Code.UNSCHEDULABLE,
        ),
        (BatchPoolFilter(), {"pool": "render", "pool_hosts": frozenset()}, {}, Code.UNSCHEDULABLE),
    ],
)
def test_filters(flt, req, host, code):  # type: ignore[no-untyped-def]
    st = flt.filter(make_request("r", **req), state(**host))
    assert st.code is code
    assert st.ok is (code is Code.OK)
    assert bool(st.reasons) is (code is not Code.OK)


@pytest.mark.parametrize(
    ("reserved_at", "reserved_for", "duration", "ok"),
    [
        (None, None, None, True),
        (500.0, "other", None, False),  # unknown end: could delay the head
        (500.0, "other", 400.0, True),  # ends at 500: before the reservation
        (500.0, "other", 401.0, False),
        (500.0, "r", None, True),  # the head itself
    ],
)
def test_reservation_filter(reserved_at, reserved_for, duration, ok):  # type: ignore[no-untyped-def]
    hs = state()
    hs.reserved_at, hs.reserved_for = reserved_at, reserved_for
    st = ReservationFilter(now=100.0).filter(make_request("r", expected_duration=duration), hs)
    assert st.ok is ok


MIX = ((1, 1000, 0.5), (4, 1000, 0.25), (0, 250, 0.25))


@pytest.mark.parametrize(
    ("score", "req", "better", "worse"),
    [
        (BestFitScore(1), {"gpus_per_node": 2}, {"whole": range(6)}, {}),
        (
            BestFitScore(1),
            {"gpus_per_node": 0, "gpu_milli": 250},
            {"shares": {0: 750}},
            {"shares": {0: 250}},
        ),
        (MostAllocatedScore(1), {"gpus_per_node": 1}, {"whole": range(4)}, {}),
        (LoadScore(1), {}, {"util": 0.1}, {"util": 0.9}),
        (
            TopologyScore(1),
            {"gpus_per_node": 4},
            {"island_size": 4, "whole": [0]},
            {"island_size": 4, "whole": [0, 4]},
        ),
        (
            TopologyScore(1),
            {"gpus_per_node": 1},
            {"island_size": 4, "whole": [0, 1, 2]},
            {"island_size": 4, "whole": [0]},
        ),
        (
            FragScore(CycleContext(now=0, mix=MIX), 1),
            {"gpus_per_node": 4},
            {"whole": range(4)},
            {"whole": range(2)},
        ),
        (
            FragScore(CycleContext(now=0, mix=MIX), 1),
            {"gpus_per_node": 0, "gpu_milli": 250},
            {"shares": {0: 750}},
            {},
        ),
    ],
)
def test_scores_rank_hosts(score, req, better, worse):  # type: ignore[no-untyped-def]
    r = make_request("r", **req)
    hi, lo = score.score(r, state(**better)), score.score(r, state(**worse))
    assert 0 <= lo < hi <= MAX_SCORE


@pytest.mark.parametrize(
    ("host", "g", "expected"),
    [
        ({}, 2, [0, 1]),
        ({"island_size": 4, "whole": [0]}, 3, [1, 2, 3]),  # fullest island that fits
        ({"island_size": 4, "whole": [0, 1, 4]}, 3, [5, 6, 7]),
        ({"island_size": 8, "numa_size": 4, "whole": [0, 1]}, 2, [2, 3]),  # one NUMA node
        ({"island_size": 2, "whole": [0, 2, 4, 6]}, 3, [1, 3, 5]),  # must span islands
        ({"whole": range(7)}, 2, None),
    ],
)
def test_pick_whole_prefers_one_island_then_one_numa_node(host, g, expected):  # type: ignore[no-untyped-def]
    assert pick_whole(state(**host), g) == expected


@pytest.mark.parametrize(
    ("how", "shares", "expected"),
    [
        ("best-fit", {0: 500, 1: 250}, 0),  # tightest fit
        ("spread", {0: 500, 1: 250}, 2),  # most room
        ("frag", {0: 500, 1: 750}, 1),  # fills the 250 hole exactly
    ],
)
def test_pick_share(how, shares, expected):  # type: ignore[no-untyped-def]
    assert pick_share(state(gpus=4, shares=shares), 250, how, MIX, tenant="t1") == expected


def test_everything_is_registered_by_name():
    assert {"ready", "gpu-model", "region", "gpus", "resources", "nvlink", "reservation"} <= set(
        FILTERS
    )
    assert {"best-fit", "binpack", "least-allocated", "load", "topology", "frag-aware"} <= set(
        SCORES
    )
    assert set(PLACEMENTS) >= {"first-fit", "best-fit", "binpack", "spread", "frag-aware"}
    for spec in PLACEMENTS.values():
        assert all(name in SCORES for name, _w in spec.scores)
