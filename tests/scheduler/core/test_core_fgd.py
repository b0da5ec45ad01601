"""FGD's fragmentation measure and gradient, computed by hand on two nodes."""

from __future__ import annotations

import pytest

from scheduler.core import ClusterSnapshot, Place, derive_workload, get_policy, plan
from scheduler.core.plugins import FgdModel
from scheduler.core.state import HostRes, HostState
from scheduler.core.testing import make_host, make_request

# half the tasks share 500 milli of one GPU with 2 vCPUs, half take one whole
# GPU with 8 vCPUs
WORKLOAD = ((0, 500, 2, 0.5), (1, 1000, 8, 0.5))


def state(host_id: str, **kw) -> HostState:  # type: ignore[no-untyped-def]
    view = make_host(host_id, **kw)
    return HostState(
        view,
        view.gpus[0].model,
        HostRes(view.free_vcpus, view.free_memory_mib, view.total_vcpus, view.total_memory_mib),
    )


def hosts():  # type: ignore[no-untyped-def]
    # a: GPU0 has 300 milli free, GPUs 1-3 are free, 9 vCPUs free
    # b: four free GPUs, 16 vCPUs free
    return (
        make_host("a", gpus=4, vcpus=9, shares={0: 700}),
        make_host("b", gpus=4, vcpus=16),
    )


def test_fragmentation_by_hand():
    m = FgdModel(WORKLOAD)
    # a: the 500 share cannot use GPU0's 300 (300); the whole GPU cannot use the
    # partly used GPU0 (300): 0.5 * 300 + 0.5 * 300
    assert m.frag(9, [300, 1000, 1000, 1000]) == pytest.approx(300.0)
    # with 7 vCPUs the whole-GPU task no longer fits: all 3000 free milli count
    assert m.frag(7, [0, 1000, 1000, 1000]) == pytest.approx(1500.0)
    assert m.frag(7, [300, 700, 1000, 1000]) == pytest.approx(0.5 * 300 + 0.5 * 3000)
    # b: nothing is stranded; after a 300 share, the whole task strands the 700
    assert m.frag(16, [1000] * 4) == pytest.approx(0.0)
    assert m.frag(14, [700, 1000, 1000, 1000]) == pytest.approx(350.0)


def test_gradient_picks_the_node_that_fragments_least():
    m = FgdModel(WORKLOAD)
    a = state("a", gpus=4, vcpus=9, shares={0: 700})
    b = state("b", gpus=4, vcpus=16)
    # a 300-milli share with 2 vCPUs: best fit would fill a's GPU0 exactly, but that
    # leaves a 7 vCPUs, too few for the whole-GPU half of the workload
    assert m.best_share(a, 300, 2, "t1") == (0, pytest.approx(1200.0))  # 1500 - 300
    assert m.best_share(b, 300, 2, "t1") == (0, pytest.approx(350.0))  # 350 - 0
    assert m.delta_whole(b, 1, 8) == pytest.approx(0.0)  # 1 whole, 8 left: all fit
    assert m.delta_whole(a, 1, 8) == pytest.approx(0.5 * 2300 + 0.5 * 2300 - 300)


def test_frag_aware_places_by_the_gradient():
    s = ClusterSnapshot(hosts=hosts())
    req = make_request("r", gpus_per_node=0, gpu_milli=300, vcpus=2)
    fgd = get_policy("gpucloud").with_(placement="fgd", mode="static", workload=WORKLOAD)
    (d,) = plan(s, [req], fgd, now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "b"
    assert d.placements[0].gpus == ("b-g0",)
    bf = get_policy("gpucloud").with_(placement="best-fit", mode="static")
    (d,) = plan(s, [req], bf, now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "a"


def test_ties_go_to_the_lower_host_id():
    s = ClusterSnapshot(hosts=(make_host("b", gpus=4), make_host("a", gpus=4)))
    req = make_request("r", gpus_per_node=2)
    pol = get_policy("gpucloud").with_(placement="fgd", mode="static", workload=WORKLOAD)
    (d,) = plan(s, [req], pol, now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "a"


def test_derive_workload_counts_shapes():
    reqs = [
        make_request("1", gpus_per_node=0, gpu_milli=500, vcpus=2),
        make_request("2", gpus_per_node=0, gpu_milli=500, vcpus=2),
        make_request("3", gpus_per_node=1, vcpus=8),
        make_request("4", gpus_per_node=0, gpu_milli=500, vcpus=4),
    ]
    assert derive_workload(reqs) == (
        (0, 500, 2, 0.5),
        (0, 500, 4, 0.25),
        (1, 1000, 8, 0.25),
    )


def test_score_is_fgds_sigmoid_of_the_gradient():
    from scheduler.core.plugins import FgdGradientScore

    sc = FgdGradientScore(FgdModel(WORKLOAD))
    req = make_request("r", gpus_per_node=0, gpu_milli=300, vcpus=2)
    # int(100 / (1 + e^(delta / 1000))): delta 1200 -> 23, delta 350 -> 41
    assert sc.score(req, state("a", gpus=4, vcpus=9, shares={0: 700})) == 23
    assert sc.score(req, state("b", gpus=4, vcpus=16)) == 41
    # no GPU with room: the lowest score
    assert sc.score(req, state("c", gpus=1, whole=[0])) == 0
