"""The engine's incremental indexes against the from-scratch answers they replace.

``_victim_hosts`` walks per-rank host indexes (``victim_index``, and under time
slicing ``evictable_index`` fed by the ``ripening`` heap) instead of every busy
host's runs; lending's ``_classes`` stops walking a tenant's runs once its
guarantee has no room left and reclasses only the runs not yet ``low``. Each
replay below checks, at every scheduling point, the indexed answer against the
walk over the runs, and the lending classes against the rule applied to every
run, over seven policies with and without lending, preemptions and restarts.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.core import get_policy
from scheduler.core.model import WHOLE
from scheduler.sim.engine import Simulator
from scheduler.sim.trace import Job, Node

POLICIES = ["gpucloud", "las", "srtf", "sjf", "drf", "priority", "fifo"]


class _Checked(Simulator):
    """A replay that checks the indexes at every scheduling point."""

    checks = 0
    ripe = 0

    def _victim_hosts(self, min_rank, need, now):  # type: ignore[no-untyped-def]
        got = super()._victim_hosts(min_rank, need, now)
        assert got == self._victim_hosts_walk(min_rank, need, now)
        for rank, index in enumerate(self.victim_index):
            assert index == sorted(h for h in self.busy if self.hosts[h].victims[rank])
        for rank, index in enumerate(self.evictable_index):
            assert index == sorted(h for h in self.busy if self.hosts[h].evictable[rank])
        readable = self._readable(min_rank, now)
        if self.policy.time_slice:
            self._ripen(now)  # sets only flags that hold now (and stay so)
        for run in self.running.values():
            # the flag is exactly the rule, for every victim candidate
            candidate = run.drank >= 0 and not run.preempting
            assert run.evictable == bool(
                self.policy.time_slice and candidate and run.js.checkpoint and self._evictable(run, now)
            )
            # what _allocations takes for granted of an evictable run
            if run.evictable and readable is not None and readable[1] is not None:
                if self.policy.time_slice == "las" and run.drank == min_rank:
                    assert readable[1](run)
        type(self).checks += 1
        type(self).ripe += sum(map(len, self.evictable_index))
        return got

    def _victim_hosts_walk(self, min_rank, need, now):  # type: ignore[no-untyped-def]
        """``_victim_hosts`` by walking every busy host and testing its runs (the
        engine's rule before its indexes: the oracle they are checked against)."""
        hosts = self.hosts
        victims = set()
        ts = self.policy.time_slice
        if self.may_preempt and any(
            c for rk, c in self.rank_runs.items() if rk > min_rank or (ts and rk == min_rank)
        ):
            quanta = [q for _c, q in self.policy.slice_quantum]
            started_by = now - min([self.policy.min_run_s, *quanta])
            th0 = self.policy.las_thresholds[0] if self.policy.las_thresholds else 0.0
            las = ts == "las"
            want = 2 * (self.policy.preempt_candidates + max(need.values(), default=1))
            above = min_rank + 1
            for hid in self.busy:
                h = hosts[hid]
                counts = h.victims
                if not any(counts[above:]):
                    # inside the class only time-sliced work that may be evicted now
                    if not ts or not 0 <= min_rank < len(counts) or not counts[min_rank]:
                        continue
                    found = False
                    for run in h.runs.values():
                        if run.start > started_by:
                            break  # a host's runs are in start order: the rest started later
                        if run.drank != min_rank or run.preempting or not run.js.checkpoint:
                            continue
                        if las and run.js.attained + (now - run.start) * run.milli / WHOLE < th0:
                            continue  # still in the first attained-service queue
                        found = True
                        break
                    if not found:
                        continue
                victims.add(hid)
                if len(victims) >= want:
                    break
        return victims

    def _classes(self):  # type: ignore[no-untyped-def]
        tenants = set(self.dirty_tenants)
        out = super()._classes()
        for tn in tenants:
            g = self.guarantee_milli.get(tn, 0)
            cum = 0
            for jid, r in self.tenant_runs.get(tn, {}).items():
                cls = "standard" if cum + r.milli <= g else "low"
                if cls == "standard":
                    cum += r.milli
                if not r.preempting:
                    assert r.priority == cls, (jid, r.priority, cls)
                assert (jid in self.nonlow_runs[tn]) == (r.priority != "low")
        return out


def _jobs(seed: int, n: int) -> list[Job]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        share = rng.random() < 0.2
        jobs.append(
            Job(
                f"j{i:03d}",
                float(rng.randint(0, 2500)),
                float(rng.randint(30, 5000)),
                0 if share else rng.choice((1, 1, 1, 2, 4, 8)),
                rng.choice((250, 500)) if share else 1000,
                tenant=rng.choice(("a", "b", "c")),
                priority=rng.choice(("standard", "standard", "low")),
            )
        )
    return jobs


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("lend", [False, True])
@pytest.mark.parametrize("seed", [3, 17])
def test_indexed_victim_hosts_and_classes_match_the_walk_over_the_runs(policy, lend, seed):  # type: ignore[no-untyped-def]
    nodes = [Node(f"n{i:02d}", "H100", 8, 2) for i in range(5)]
    jobs = _jobs(seed, 120)
    pol = get_policy(policy).with_(max_waits=3, min_run_s=60.0, las_thresholds=(400.0, 9000.0), preempt_candidates=2)
    if lend:
        pol = pol.with_(
            preemption=True,
            mode="hybrid",
            mode_per_class=(("critical", "static"), ("standard", "dynamic"), ("low", "dynamic")),
        )
    kw = {"guarantees": {"a": 16.0, "b": 8.0, "c": 4.0} if lend else None, "checkpoint_fraction": 0.5}
    _Checked.checks = _Checked.ripe = 0
    checked = _Checked(nodes, [replace(j) for j in jobs], pol, **kw)
    res = checked.run()
    plain = Simulator(nodes, [replace(j) for j in jobs], pol, **kw).run()
    assert [(r.job_id, r.start, r.end, r.hosts) for r in res.runs] == [
        (r.job_id, r.start, r.end, r.hosts) for r in plain.runs
    ]
    assert _Checked.checks > 0
    if checked.may_preempt and checked.policy.time_slice:
        # the time-sliced path was exercised: candidates did become evictable
        assert _Checked.ripe > 0
        assert res.preemptions > 0
