"""Every replay ends: small random traces under every policy, with and without
lending, within a bounded number of events, and without booking a GPU twice.

The livelock this guards against: an order that ignores the class (srtf, las,
and fifo, sjf or drf once lending makes them preempt) put a preempted
lower-class job back on the GPUs its notice had just freed, ahead of the
request the notice was given for; that request preempted it again at once (by
class there is no quantum), and so on. Without checkpoints nothing progressed,
so the replay never ended (with a zero notice the clock stood still too)."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from scheduler.core import get_policy
from scheduler.core.policy import QUEUE_ORDERS, Policy
from scheduler.sim.engine import Result, Simulator
from scheduler.sim.trace import WHOLE, Job, Node

TRACES = 60


class EventsOver(AssertionError):
    pass


class BoundedSimulator(Simulator):
    """The replay with a bound on the events it schedules (job ends and notice
    stops): past the bound it stops with ``EventsOver`` instead of running on."""

    def __init__(self, *args: object, max_events: int, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.max_events = max_events
        self.pushed = 0

    def _push(self, t: float, kind: str, jid: str, ver: int) -> None:
        self.pushed += 1
        if self.pushed > self.max_events:
            raise EventsOver(f"over {self.max_events} events, at t={t}")
        super()._push(t, kind, jid, ver)


def lending(policy: Policy) -> Policy:
    """As the lending replays run every order: standard and low work may be preempted."""
    return policy.with_(
        preemption=True,
        mode="hybrid",
        mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic")),
    )


def replay(seed: int, policy: str, lend: bool) -> tuple[list[Node], list[Job], Result]:
    """One small random trace: 1-3 hosts of 8 GPUs, 2-15 jobs submitted in the
    first 3000 s, 30-6000 s long, 1-8 GPUs; notice 0 or 30 s, quantum 300 s,
    none, half or all of the jobs checkpointing."""
    rng = random.Random(seed)
    nodes = [Node(f"n{i}", "H100", 8, 2) for i in range(rng.randint(1, 3))]
    jobs = [
        Job(
            f"j{i:02d}",
            float(rng.randint(0, 3000)),
            float(rng.randint(30, 6000)),
            rng.choice((1, 1, 2, 4, 8, 8)),
            tenant=rng.choice(("a", "b")),
            priority=rng.choice(("standard", "standard", "low")),
        )
        for i in range(rng.randint(2, 15))
    ]
    pol = get_policy(policy).with_(min_run_s=300.0, notice_s=rng.choice((0.0, 30.0)))
    guarantees = None
    if lend:
        pol = lending(pol)
        guarantees = {"a": 8.0, "b": 4.0}
    sim = BoundedSimulator(
        nodes,
        jobs,
        pol,
        guarantees=guarantees,
        checkpoint_fraction=rng.choice((0.0, 0.5, 1.0)),
        # an end per job and a few preemptions each: far above any replay that ends
        max_events=100 * len(jobs) + 100,
    )
    return nodes, jobs, sim.run()


def assert_within_capacity(nodes: list[Node], res: Result) -> None:
    """No host ever holds more than its GPUs (ends before starts at one instant)."""
    events: list[tuple[float, int, str, int]] = []
    for r in res.runs:
        assert len(r.hosts) == len(set(r.hosts))
        per = r.gpus * WHOLE or r.milli
        for h in r.hosts:
            events.append((r.start, 1, h, per))
            events.append((r.end, 0, h, -per))
    cap = {n.node_id: n.num_gpus * WHOLE for n in nodes}
    used: dict[str, int] = defaultdict(int)
    for t, _k, h, d in sorted(events):
        used[h] += d
        assert used[h] <= cap[h], f"{h} over capacity at t={t}"


@pytest.mark.parametrize("lend", [False, True], ids=["pool", "lend"])
@pytest.mark.parametrize("policy", QUEUE_ORDERS)
def test_every_replay_of_a_small_random_trace_ends_within_capacity(policy, lend):
    for seed in range(TRACES):
        try:
            nodes, jobs, res = replay(seed, policy, lend)
        except EventsOver as e:
            raise AssertionError(f"{policy} lend={lend} seed={seed}: {e}") from None
        where = f"{policy} lend={lend} seed={seed}"
        for j in jobs:
            js = res.jobs[j.job_id]
            assert not js.rejected, where
            assert js.end is not None and js.end >= j.submit + j.duration, where
        last = {r.job_id: r for r in sorted(res.runs, key=lambda r: r.start)}
        assert not any(r.preempted for r in last.values()), where
        assert_within_capacity(nodes, res)


def test_the_gpus_a_notice_frees_go_to_the_request_it_was_given_for():
    # one host of 8 GPUs, two low jobs of 4 GPUs each and no checkpoints; std
    # (standard, 4 GPUs) comes at 10 and preempts low1 (30 s notice). srtf's
    # order puts low1 (1000 s left, from scratch) before std (5000 s): it used
    # to take its GPUs back at 40, std preempted low2, low2 took them back at 70,
    # and so on for ever
    nodes = [Node("n0", "H100", 8)]
    jobs = [
        Job("low1", 0, 1000, 4, priority="low"),
        Job("low2", 0, 1000, 4, priority="low"),
        Job("std", 10, 5000, 4, priority="standard"),
    ]
    sim = BoundedSimulator(nodes, jobs, get_policy("srtf"), checkpoint_fraction=0.0, max_events=20)
    res = sim.run()
    assert sorted((r.job_id, r.start, r.end, r.preempted) for r in res.runs) == [
        ("low1", 0, 40, True),
        ("low1", 1000, 2000, False),  # restarts from scratch once low2 has ended
        ("low2", 0, 1000, False),
        ("std", 40, 5040, False),
    ]
    assert res.preemptions == 1
