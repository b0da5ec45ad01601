"""The simulator's learned durations (issue 33) see only jobs that have ended.

A replay may read a job's duration to know when it ends, never to estimate other
jobs before it has ended. So shuffling the durations of jobs that are still going
(or not yet submitted) at a time T must leave every decision before T as it was."""

from __future__ import annotations

import random

from scheduler.core import get_policy
from scheduler.sim.engine import Result, Simulator
from scheduler.sim.trace import Job, Node

#: the cut: long jobs run at least this long, so none of them ends before it
CUT = 20_000.0


def trace(seed: int) -> tuple[list[Node], list[Job]]:
    """Two tenants on 1-2 hosts of 8 GPUs: short jobs (60-900 s) to learn from, and
    long ones (>= CUT) of every size, all submitted before the cut, so the queue is
    contended while the estimator learns."""
    rng = random.Random(seed)
    nodes = [Node(f"n{i}", "H100", 8, 2) for i in range(rng.randint(1, 2))]
    jobs = []
    for i in range(rng.randint(25, 45)):
        long = rng.random() < 0.35
        jobs.append(
            Job(
                f"j{i:02d}",
                float(rng.randint(0, int(CUT * 0.8))),
                float(rng.randint(int(CUT), int(5 * CUT))) if long else float(rng.randint(60, 900)),
                rng.choice((1, 1, 2, 4, 8)),
                tenant=rng.choice(("a", "b")),
            )
        )
    return nodes, jobs


def shuffle_future(jobs: list[Job], seed: int) -> list[Job]:
    """The long jobs' durations, shuffled among them: every one of them ends after
    the cut either way, so before the cut nothing may tell the two traces apart."""
    rng = random.Random(seed + 1)
    long = [j for j in jobs if j.duration >= CUT]
    durations = [j.duration for j in long]
    rng.shuffle(durations)
    new = dict(zip((j.job_id for j in long), durations, strict=True))
    return [Job(j.job_id, j.submit, new.get(j.job_id, j.duration), j.gpus_per_node, tenant=j.tenant) for j in jobs]


def before_cut(res: Result) -> list[tuple[object, ...]]:
    """Every decision taken before the cut: which run started when and where, and
    how runs that stopped before the cut stopped."""
    return sorted(
        (r.job_id, r.start, r.hosts, r.gpus, r.end if r.end < CUT else None, r.preempted if r.end < CUT else None)
        for r in res.runs
        if r.start < CUT
    )


def test_shuffling_future_durations_changes_no_decision_before_they_end():
    learned = 0
    differ = 0
    for seed in range(30):
        nodes, jobs = trace(seed)
        shuffled = shuffle_future(jobs, seed)
        a = Simulator(nodes, jobs, get_policy("gpucloud")).run()
        b = Simulator(nodes, shuffled, get_policy("gpucloud")).run()
        assert before_cut(a) == before_cut(b), f"seed {seed}"
        learned += sum(1 for js in a.jobs.values() if js.first_est is not None)
        # the shuffle does matter once the long jobs end (so the runs are not inert)
        differ += sorted((r.job_id, r.start, r.end) for r in a.runs) != sorted(
            (r.job_id, r.start, r.end) for r in b.runs
        )
    # the estimates were there to peek with: requests carried them, the replays differ
    assert learned > 100
    assert differ > 10


def test_estimates_order_the_queue_in_the_simulator():
    """A job class seen to be short overtakes an older long one, which it could not
    without the estimate (the same replay without learning keeps the age order)."""
    nodes = [Node("n0", "H100", 8, 2)]
    jobs = [Job(f"s{i}", float(i), 100.0, 8, tenant="t") for i in range(3)]  # teach: 8 GPUs, 100 s
    jobs += [Job(f"l{i}", float(i), 5000.0, 4, tenant="t") for i in range(3)]  # and 4 GPUs, 5000 s
    jobs += [
        Job("busy", 30_000.0, 600.0, 8, tenant="t"),
        Job("old-long", 30_010.0, 5000.0, 4, tenant="t"),
        Job("new-short", 30_020.0, 100.0, 8, tenant="t"),
    ]
    learned = Simulator(nodes, jobs, get_policy("gpucloud")).run()
    plain = Simulator(nodes, jobs, get_policy("gpucloud").with_(learn_durations=False)).run()

    def first_start(res: Result, jid: str) -> float:
        return min(r.start for r in res.runs if r.job_id == jid)

    assert first_start(learned, "new-short") < first_start(learned, "old-long")
    assert first_start(plain, "new-short") > first_start(plain, "old-long")
