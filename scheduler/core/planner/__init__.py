"""``plan()``: one scheduling cycle over a snapshot and a queue, in stages.

    queue ──order──▶ admission ──▶ candidates (index) ──filter──▶ score ──▶ Place
                         │ reject/quota        │ none fit
                         ▼                     ▼
                  Reject / Wait      preempt (dynamic classes) ──▶ Preempt* + Wait
                                               │ no victims
                                               ▼
                                 reserve for the head (backfill) ──▶ Wait
    after the queue: reclaim idle GPUs (dynamic) ▸ migration suggestions (defrag)

One module per stage, all functions over one ``CycleState`` (the state a call builds
from its arguments), in the spirit of Nomad's feasible/rank/select/preemption
split and kube-scheduler's PostFilter:

    cycle.py       CycleState: policy, clock, fleet working state, plugins, books,
                   decisions, and the memos later requests reuse
    admission.py   decide, refusal (invalid, never_fits), admit, admit_pinned, wait, reject
    placement.py   find, find_in, candidates, walk, why, commit
    preemption.py  BlastRadius (the cap), may_preempt, can_evict (evictable over a
                   host's work, slice_key once per cycle), find_victims,
                   host_victims, greedy, lost_work, give_notice
    backfill.py    earliest_fit, reserve, mark_reserved
    fit.py         fits_now, fits_with, fits_counts (what preemption and backfill ask)
    dynamic.py     reclaim, defragment (after the queue)
    workload.py    derive_mix, derive_workload
    words.py       numbers in reasons

Each module imports only those listed below it (``lint-imports`` checks it).
See docs/scheduler.md for the full story.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from ..gcpause import gc_paused
from ..model import ClusterSnapshot, PlacementRequest, Plan, PlanCounters, Wait
from ..policy import Policy, get_policy
from ..queue import Order, make_order
from ..state import PlanCache
from .admission import FleetLimits, decide, refusal
from .cycle import ALL_HOSTS, CycleState
from .dynamic import defragment, reclaim
from .words import plural
from .workload import derive_mix, derive_workload

__all__ = ["ALL_HOSTS", "FleetLimits", "derive_mix", "derive_workload", "plan", "refusal"]


def plan(
    snapshot: ClusterSnapshot,
    queue: Iterable[PlacementRequest],
    policy: Policy | str,
    *,
    now: float,
    cache: PlanCache | None = None,
) -> Plan:
    """Decide one cycle. Pure: same arguments, same plan.

    ``queue`` holds the pending requests (any order; the policy orders them).
    Running work, tenants and idle data come in ``snapshot``.

    ``cache`` (optional) lets a caller that plans again and again over mostly the
    same ``HostView`` objects skip rebuilding their working state; the plan is
    the same with or without it (see ``PlanCache``).
    """
    pol = get_policy(policy) if isinstance(policy, str) else policy
    reqs = list(queue)
    with gc_paused():
        if cache is None:
            return _run(CycleState(snapshot, reqs, pol, now))
        cycle = None
        try:
            cycle = CycleState(snapshot, reqs, pol, now, cache)
            return _run(cycle)
        finally:
            if cycle is None or sys.exc_info()[0] is not None:
                cache.clear()  # half-built or half-booked state: start afresh
            else:
                cache.keep(cycle.fleet, cycle.decisions, cycle.any_reserved)


def _run(cycle: CycleState) -> Plan:
    """Decide each request in the policy's order, then the stages after the queue."""
    policy = cycle.policy
    order = make_order(policy, cycle.requests, cycle.shares, cycle.now)
    max_waits = policy.max_waits
    if max_waits is None:
        while (req := order.pop()) is not None:
            placed = decide(cycle, req)
            order.done(req, placed)
    else:
        misses = 0
        while (req := order.pop()) is not None:
            placed = decide(cycle, req)
            order.done(req, placed)
            if not placed:
                misses += 1
                if misses >= max_waits:
                    break
        _leave_unexamined(cycle, order, misses)
    if policy.reclaim:
        reclaim(cycle)
    if policy.defrag:
        defragment(cycle)
    counts = cycle.counts
    return Plan(
        policy=policy.name,
        now=cycle.now,
        decisions=tuple(cycle.decisions),
        counters=PlanCounters(
            placed=counts["placed"],
            backfilled=counts["backfilled"],
            waiting=counts["waiting"],
            rejected=counts["rejected"],
            preempted=counts["preempted"],
            reclaimed=counts["reclaimed"],
            migrations=counts["migrations"],
            placed_gpu_milli=counts["placed_gpu_milli"],
            hosts_examined=counts["examined"],
        ),
    )


def _leave_unexamined(cycle: CycleState, order: Order, misses: int) -> None:
    """The depth cap: what is left of the queue waits without being looked at."""
    rest = []
    while (req := order.pop()) is not None:
        rest.append(req)
        order.done(req, False)
    if not rest:
        return
    reason = f"not examined this cycle: {plural(misses, 'request')} ahead of it could not start"
    cycle.decisions.extend([Wait(r.request_id, reason) for r in rest])
    cycle.counts["waiting"] += len(rest)
