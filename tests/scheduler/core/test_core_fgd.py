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


# ------------------------------------------------- work without GPUs (FGD's CPU pods)

# FGD's workload keeps the GPU-less pods: a quarter of the tasks take 4 vCPUs only
WITH_CPU = ((0, 500, 2, 0.375), (1, 1000, 8, 0.375), (0, 0, 4, 0.25))


def test_gpu_less_shapes_use_no_gpu_milli():
    m = FgdModel(WITH_CPU)
    # the GPU-less quarter can use none of the free milli (FGD's XL/XR: all of it counts)
    assert m.frag(16, [1000] * 4) == pytest.approx(0.25 * 4000)
    assert m.frag(9, [300, 1000, 1000, 1000]) == pytest.approx(
        0.375 * 300 + 0.375 * 300 + 0.25 * 3300
    )
    # 4 vCPUs of a: 5 left, too few for the whole-GPU task
    a = state("a", gpus=4, vcpus=9, shares={0: 700})
    assert m.delta_cpu(a, 4) == pytest.approx(0.375 * 3300 - 0.375 * 300)
    b = state("b", gpus=4, vcpus=16)
    assert m.delta_cpu(b, 4) == pytest.approx(0.0)  # 12 left: everything still fits


def test_fgd_places_work_without_gpus_where_it_strands_least():
    s = ClusterSnapshot(hosts=hosts())
    req = make_request("cpu", gpus_per_node=0, gpu_milli=0, vcpus=4)
    pol = get_policy("gpucloud").with_(placement="fgd", mode="static", workload=WITH_CPU)
    (d,) = plan(s, [req], pol, now=0).decisions
    assert isinstance(d, Place)
    (p,) = d.placements
    assert p.host_id == "b" and p.gpus == () and p.milli == 0
    # a host whose GPUs are all held whole still takes work without GPUs
    full = ClusterSnapshot(hosts=(make_host("z", gpus=2, vcpus=8, whole=[0, 1]),))
    (d,) = plan(full, [req], pol, now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "z"
    # ... but not one without the vCPUs
    few = ClusterSnapshot(hosts=(make_host("z", gpus=2, vcpus=2),))
    (d,) = plan(few, [req], pol, now=0).decisions
    assert not isinstance(d, Place)
    # every other placement takes it too (best-fit by vCPUs)
    bf = get_policy("gpucloud").with_(placement="best-fit", mode="static")
    (d,) = plan(s, [req], bf, now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "a"  # 9 vCPUs: the tighter


def test_a_request_without_gpus_must_ask_for_something():
    s = ClusterSnapshot(hosts=hosts())
    req = make_request("nothing", gpus_per_node=0, gpu_milli=0)
    (d,) = plan(s, [req], get_policy("gpucloud"), now=0).decisions
    assert not isinstance(d, Place) and "vCPUs or memory" in d.reason


def test_derive_workload_keeps_the_typical_shapes():
    reqs = [make_request(str(i), gpus_per_node=1, vcpus=8) for i in range(6)]
    reqs += [make_request(f"s{i}", gpus_per_node=0, gpu_milli=500, vcpus=2) for i in range(3)]
    reqs += [make_request("rare", gpus_per_node=8, vcpus=64)]
    # 95 % of 10 tasks: the two common shapes cover 9, so the third is needed too
    assert len(derive_workload(reqs, 0.95)) == 3
    # 90 %: the 8-GPU shape is left out and the rest renormalised
    assert derive_workload(reqs, 0.9) == ((1, 1000, 8, 6 / 9), (0, 500, 2, 3 / 9))


def test_the_live_default_scores_fgds_gradient_on_its_candidates():
    # frag-aware (the gpucloud preset's placement, k=2) ranks its candidates by FGD's
    # gradient: the 300-milli share avoids a, where it would leave too few vCPUs for
    # the whole-GPU half of the workload; best-fit fills a's GPU0
    s = ClusterSnapshot(hosts=hosts())
    req = make_request("r", gpus_per_node=0, gpu_milli=300, vcpus=2)
    live = get_policy("gpucloud")
    assert live.placement == "frag-aware" and live.k == 2
    (d,) = plan(s, [req], live.with_(mode="static", workload=WORKLOAD), now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "b"
    (d,) = plan(s, [req], live.with_(mode="static", placement="frag-mix"), now=0).decisions
    assert isinstance(d, Place) and d.placements[0].host_id == "a"  # the old score: no vCPUs
