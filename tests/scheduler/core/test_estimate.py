"""Durations learned from history (issue 33): the estimator and the order it feeds."""

from __future__ import annotations

import math

from scheduler.core import Allocation, HostPlacement, get_policy, plan
from scheduler.core.estimate import MIN_HISTORY, DurationEstimator, learned_service
from scheduler.core.model import ClusterSnapshot, PlacementRequest
from scheduler.core.queue import ShareBook, make_order, order_key
from scheduler.core.state import Fleet
from scheduler.core.testing import make_host, make_request, occupy, verify


def test_no_history_no_estimate():
    est = DurationEstimator()
    assert est.estimate(tenant="t", gpus=1) is None
    for _ in range(MIN_HISTORY - 1):
        est.observe(tenant="t", gpus=1, seconds=100.0)
    # thinner than MIN_HISTORY even at the tenant level: the caller falls back to LAS
    assert est.estimate(tenant="t", gpus=1) is None


def test_median_of_the_window_resists_one_outlier():
    est = DurationEstimator()
    for s in (100.0, 110.0, 90.0, 1_000_000.0, 105.0):
        est.observe(tenant="t", member="m", name="train", gpus=4, seconds=s)
    got = est.estimate(tenant="t", member="m", name="train", gpus=4)
    assert got is not None
    assert got.seconds == 105.0
    assert got.history == 5 and got.level == 0


def test_learned_incrementally_the_newest_answers_at_once():
    est = DurationEstimator(window=3)
    for s in (10.0, 10.0, 10.0):
        est.observe(tenant="t", gpus=1, seconds=s)
    assert est.estimate(tenant="t", gpus=1).seconds == 10.0  # type: ignore[union-attr]
    for s in (500.0, 500.0):
        est.observe(tenant="t", gpus=1, seconds=s)
    # the window keeps the latest 3: 10, 500, 500
    assert est.estimate(tenant="t", gpus=1).seconds == 500.0  # type: ignore[union-attr]


def test_falls_back_from_specific_to_general_keys():
    est = DurationEstimator()
    for _ in range(3):
        est.observe(tenant="t", member="ann", name="a", gpus=8, seconds=1000.0)
    for _ in range(3):
        est.observe(tenant="t", member="bob", name="b", gpus=1, seconds=50.0)
    # ann's own 8-GPU runs of "a"
    got = est.estimate(tenant="t", member="ann", name="a", gpus=8)
    assert got is not None and (got.seconds, got.level) == (1000.0, 0)
    # a new name of ann's on 8 GPUs: ann's 8-GPU history
    got = est.estimate(tenant="t", member="ann", name="new", gpus=8)
    assert got is not None and (got.seconds, got.level) == (1000.0, 1)
    # a new member on 8 GPUs: the tenant's 8-GPU history
    got = est.estimate(tenant="t", member="cy", name="x", gpus=8)
    assert got is not None and (got.seconds, got.level) == (1000.0, 2)
    # a size nobody ran: the tenant's whole history (median of 1000 x3, 50 x3)
    got = est.estimate(tenant="t", member="cy", name="x", gpus=2)
    assert got is not None and got.level == 3 and got.seconds == 525.0


def test_estimates_never_cross_tenants():
    est = DurationEstimator()
    for _ in range(10):
        est.observe(tenant="a", member="m", name="n", gpus=1, seconds=60.0)
    assert est.estimate(tenant="b", member="m", name="n", gpus=1) is None
    assert est.history(tenant="b", gpus=1) == 0


def test_runs_that_never_end_teach_nothing():
    est = DurationEstimator()
    for s in (math.inf, 0.0, -5.0, math.nan):
        est.observe(tenant="t", gpus=1, seconds=s)
    assert est.history(tenant="t", gpus=1) == 0


def _req(rid: str, *, submitted: float, est: float | None, gpus: int = 1, attained: float = 0.0) -> PlacementRequest:
    return PlacementRequest(
        request_id=rid,
        tenant_id="t",
        gpu_model="H100",
        gpus_per_node=gpus,
        kind="job",
        submitted_at=submitted,
        estimated_duration=est,
        attained_service=attained,
        restartable=True,
        checkpointable=True,
    )


def test_learned_service_is_the_expected_gpu_seconds_left():
    assert learned_service(_req("a", submitted=0, est=None)) == 0.0
    assert learned_service(_req("a", submitted=0, est=100.0, gpus=4)) == 400.0
    # 4 GPUs x 30 s attained: 70 s left on 4 GPUs
    assert learned_service(_req("a", submitted=0, est=100.0, gpus=4, attained=120.0)) == 280.0
    # outran its estimate: likely a long one, behind work still inside its estimate
    assert learned_service(_req("a", submitted=0, est=100.0, gpus=1, attained=150.0)) == math.inf


def _popped(policy_name: str, reqs: list[PlacementRequest]) -> list[str]:
    snap = ClusterSnapshot(hosts=())
    order = make_order(get_policy(policy_name), reqs, ShareBook(Fleet(snap, 0.0), snap), 0.0)
    out = []
    while (r := order.pop()) is not None:
        out.append(r.request_id)
        order.done(r, False)
    return out


def test_gpucloud_serves_the_shortest_expected_first_and_age_without_history():
    long_old = _req("long-old", submitted=0.0, est=36_000.0)
    short_new = _req("short-new", submitted=50.0, est=60.0)
    big_short = _req("big", submitted=10.0, est=60.0, gpus=8)  # 480 GPU-s
    assert _popped("gpucloud", [long_old, short_new, big_short]) == ["short-new", "big", "long-old"]
    # no estimates at all: the age order it always had
    plain = [_req(f"r{i}", submitted=float(10 - i), est=None) for i in range(4)]
    assert _popped("gpucloud", plain) == ["r3", "r2", "r1", "r0"]
    # the engine's incremental queue sorts by order_key: the same order
    reqs = [long_old, short_new, big_short]
    by_key = sorted(reqs, key=lambda r: order_key(get_policy("gpucloud"), r, 0.0))
    assert [r.request_id for r in by_key] == ["short-new", "big", "long-old"]


def test_orders_other_than_gpucloud_ignore_estimates():
    reqs = [_req("old-long", submitted=0.0, est=36_000.0), _req("new-short", submitted=5.0, est=6.0)]
    for name in ("fifo", "las", "drf", "priority"):
        assert _popped(name, reqs) == ["old-long", "new-short"], name


def test_time_slicing_stops_the_work_expected_to_hold_its_gpus_longest():
    """Two 1-GPU jobs past their quantum on a full 2-GPU host: without estimates the
    shortest running goes (the order it had); with them, the one expected to run
    on longest, and one that outran its estimate (likely long) before both."""
    now = 100_000.0

    def run(rid: str, gpu: int, started: float, end: float | None) -> Allocation:
        return Allocation(
            request_id=rid,
            tenant_id="t9",
            gpu_model="H100",
            kind="job",
            restartable=True,
            checkpointable=True,
            started_at=started,
            estimated_end=end,
            placements=(HostPlacement("h1", (f"h1-g{gpu}",)),),
        )

    def victims(*allocs: Allocation) -> list[str]:
        s = occupy(ClusterSnapshot(hosts=(make_host("h1", gpus=2),)), list(allocs))
        queue = [make_request("new", submitted_at=now - 10, kind="job")]
        p = plan(s, queue, "gpucloud", now=now)
        verify(s, queue, p)
        return [d.victim_id for d in p.preempts]

    # both have 2 h+ of attained service (a later LAS queue than the fresh request)
    assert victims(run("older", 0, now - 9000, None), run("newer", 1, now - 7200, None)) == ["newer"]
    assert victims(run("older", 0, now - 9000, now + 86_400), run("newer", 1, now - 7200, now + 60)) == ["older"]
    assert victims(run("older", 0, now - 9000, now + 86_400), run("outran", 1, now - 7200, now - 1)) == ["outran"]
