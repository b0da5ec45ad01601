"""The engine's view hands the core only the running work it could read one by one
(``Simulator._readable``); the rest is summed per tenant. The replay must equal the
one that hands over every allocation on the view's hosts."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from scheduler.core import CLASS_RANK, get_policy
from scheduler.sim.engine import Result, Simulator, _Run
from scheduler.sim.trace import Job, Node


class _ReadsAll(Simulator):
    """The slow path: every allocation touching the view, one by one."""

    def _readable(
        self, min_rank: int, now: float
    ) -> tuple[int, Callable[[_Run], bool] | None] | None:
        return None


class _Checked(Simulator):
    """Checks the per-host victim counts against a recount at every plan."""

    checks = 0

    def _schedule(self, now: float) -> bool:
        for h in self.hosts.values():
            want = [0] * len(CLASS_RANK)
            for run in h.runs.values():
                if run.drank >= 0 and not run.preempting:
                    want[run.drank] += 1
            assert h.victims == want, h.host_id
            starts = [run.start for run in h.runs.values()]
            assert starts == sorted(starts)  # the victim walk stops on start order
        self.checks += 1
        return super()._schedule(now)


def _rows(res: Result) -> tuple[object, ...]:
    runs = [(r.job_id, r.start, r.end, r.hosts, r.gpus, r.milli, r.preempted) for r in res.runs]
    jobs = sorted((j, s.first_start, s.rejected, s.preemptions) for j, s in res.jobs.items())
    return runs, jobs, res.preemptions, res.lost_gpu_s, res.plan_calls


def _trace(seed: int, resources: bool) -> list[Job]:
    rng = random.Random(seed)
    return [
        Job(
            f"j{i:03d}",
            float(rng.randint(0, 1500)),
            float(rng.randint(30, 4000)),
            rng.choice((1, 1, 1, 2, 4, 8)),
            tenant=rng.choice(("a", "b", "c")),
            priority=rng.choice(("standard", "standard", "low")),
            vcpus=rng.choice((0, 4)) if resources else 0,
            memory_mib=rng.choice((0, 4096)) if resources else 0,
        )
        for i in range(100)
    ]


@pytest.mark.parametrize("policy", ["gpucloud", "las", "srtf", "sjf", "fifo", "priority"])
@pytest.mark.parametrize("lend", [False, True])
@pytest.mark.parametrize("resources", [False, True])
def test_summed_running_work_plans_the_same_as_all_of_it(
    policy: str, lend: bool, resources: bool
) -> None:
    nodes = [Node(f"n{i:02d}", "H100", 8, 2, 64, 262144) for i in range(4)]
    jobs = _trace(11, resources)
    pol = get_policy(policy).with_(max_waits=3, min_run_s=60.0, las_thresholds=(900.0, 9000.0))
    guar = {"a": 16.0, "b": 8.0, "c": 8.0} if lend else None
    if lend:
        pol = pol.with_(
            preemption=True,
            mode="hybrid",
            mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic")),
        )
    kw = {"guarantees": guar, "checkpoint_fraction": 0.5}
    fast = _Checked(nodes, [replace(j) for j in jobs], pol, **kw)  # type: ignore[arg-type]
    slow = _ReadsAll(nodes, [replace(j) for j in jobs], pol, **kw)  # type: ignore[arg-type]
    a, b = fast.run(), slow.run()
    assert _rows(a) == _rows(b)
    assert fast.checks > 0
    assert a.preemptions > 0 or not fast.may_preempt
    # everything ended: no victim candidates are left on any host
    assert all(h.victims == [0] * len(CLASS_RANK) and not h.runs for h in fast.hosts.values())
