"""Admission: what happens to one request, stage by stage (the cycle calls
``decide`` for each request the queue order pops).

    decide ─▶ refusal (invalid, never_fits) ─▶ Reject
       └▶ admit ─▶ budget, quota ─▶ Wait (not for capacity)
            ├▶ head of line blocked (no backfill) ─▶ Wait
            ├▶ pinned to a host ─▶ admit_pinned
            └▶ placement.find ─▶ placement.commit ─▶ Place
                   │ no room
                   ▼
               preemption (PostFilter) ─▶ Preempt* + Wait
                   │ no victims
                   ▼
               backfill.reserve for the first blocked request ─▶ Wait

``refusal`` is the one rule for "reject outright"; the simulator asks it too when
a job arrives, against its whole fleet (``FleetLimits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from ..blockers import BUDGET_EXCEEDED, Blocker, words
from ..model import CLASS_RANK, WHOLE, PlacementRequest, Reject, Wait
from ..state import INF
from .backfill import earliest_fit, mark_reserved, reserve
from .cycle import CycleState, NoRoom, Shape
from .placement import commit, find, what, why
from .preemption import (
    BlastRadius,
    find_victims,
    give_notice,
    host_victims,
    known_no_victims,
    may_preempt,
    reserve_hosts_of,
    time_slice_key,
    victim_words,
)
from .words import gib, plural


class FleetLimits(Protocol):
    """What ``never_fits`` reads of a fleet: every host, ready or not (a host that
    is down now may come back). The cycle's ``Fleet`` is one; the simulator's
    whole fleet (the core sees only a view of it) is another."""

    @property
    def max_gpus(self) -> Mapping[tuple[str, str | None], int]:
        """(gpu model, region or None) -> GPUs of that model on the largest host."""
        ...

    @property
    def max_vcpus(self) -> int: ...

    @property
    def max_mem(self) -> int: ...

    def hosts_with(self, model: str, region: str | None, c: int) -> int:
        """How many hosts have at least ``c`` GPUs of ``model``."""
        ...


def refusal(req: PlacementRequest, fleet: FleetLimits) -> str:
    """Why ``req`` is rejected outright - malformed, or more than any host of the
    fleet could ever hold - or "" when it may wait for room."""
    return invalid(req) or never_fits(req, fleet)


def invalid(req: PlacementRequest) -> str:
    """Why ``req`` is malformed, or ""."""
    if req.nodes < 1:
        return "a request needs at least one node"
    if req.gpus_per_node < 0 or req.vcpus < 0 or req.memory_mib < 0:
        return "GPU, vCPU and memory amounts cannot be negative"
    if req.gpus_per_node == 0:
        if not 0 <= req.gpu_milli < WHOLE:
            return "a fractional GPU share must be between 1 and 999 milli-GPUs"
        if req.nodes > 1:
            return "fractional GPU shares are single-node"
        if req.gpu_milli == 0 and not (req.vcpus or req.memory_mib):
            return "a request without GPUs must ask for vCPUs or memory"
    elif req.gpu_milli != WHOLE:
        return "whole-GPU requests take whole GPUs (gpu_milli must be 1000)"
    if req.pinned_host is not None and req.nodes > 1:
        return "work pinned to one host (a volume lives there) runs on one node"
    return ""


def never_fits(req: PlacementRequest, fleet: FleetLimits) -> str:
    """Why no host of ``fleet`` could ever hold ``req``, or ""."""
    model, region = req.gpu_model, req.region
    biggest = fleet.max_gpus.get((model, region))
    g = req.gpus_per_node
    if (
        biggest is not None
        and g <= biggest
        and req.vcpus <= fleet.max_vcpus
        and req.memory_mib <= fleet.max_mem
        and (req.nodes == 1 or req.nodes <= fleet.hosts_with(model, region, max(g, 1)))
    ):
        return ""  # the common case: no words to build
    where = f" in {region}" if region else ""
    if biggest is None:
        return f"the fleet has no {model} GPUs{where}"
    if g > biggest:
        return (
            f"asks for {g} {model} GPUs on one host but the largest {model} host{where} "
            f"has {biggest}"
        )
    if req.nodes > 1:
        have = fleet.hosts_with(model, region, max(g, 1))
        if req.nodes > have:
            return (
                f"asks for {req.nodes} hosts with {g} {model} GPUs each but the fleet{where} "
                f"has {have}"
            )
    if req.vcpus > fleet.max_vcpus:
        return f"asks for {req.vcpus} vCPUs but the largest host has {fleet.max_vcpus}"
    if req.memory_mib > fleet.max_mem:
        return (
            f"asks for {gib(req.memory_mib)} GiB memory but the largest host has "
            f"{gib(fleet.max_mem)} GiB"
        )
    return ""


def decide(cycle: CycleState, req: PlacementRequest) -> bool:
    """Place, preempt for, reject or queue ``req``; True when it was placed."""
    bad = refusal(req, cycle.fleet)
    if bad:
        return reject(cycle, req, bad)
    return admit(cycle, req)


def wait(cycle: CycleState, req: PlacementRequest, reason: str, *, capacity: bool = True) -> bool:
    """``req`` waits. ``capacity``: it waits for room (so it counts in "N requests
    ahead of you" and in the demand reclaim answers), not for its budget or quota."""
    if capacity:
        model = req.gpu_model
        ahead = cycle.waiting_ahead.get(model, 0)
        if ahead:
            reason = f"{reason}; {plural(ahead, 'request')} ahead of you"
        cycle.waiting_ahead[model] = ahead + 1
        cycle.waiting_milli[model] = cycle.waiting_milli.get(model, 0) + req.total_milli
    cycle.decisions.append(Wait(req.request_id, reason))
    cycle.counts["waiting"] += 1
    return False


def reject(cycle: CycleState, req: PlacementRequest, reason: str) -> bool:
    cycle.decisions.append(Reject(req.request_id, reason))
    cycle.counts["rejected"] += 1
    return False


def _dominated(failures: list[tuple[Shape, NoRoom]] | None, shape: Shape) -> NoRoom | None:
    """Why a remembered failure ``shape`` is at least as large as found no room."""
    if failures:
        for failed, no_room in failures:
            if (
                shape[0] >= failed[0]
                and shape[1] >= failed[1]
                and shape[2] >= failed[2]
                and shape[3] >= failed[3]
                and shape[4] >= failed[4]
            ):
                return no_room
    return None


def admit(cycle: CycleState, req: PlacementRequest) -> bool:
    """A well-formed request: budget and quota, then placement, preemption and
    backfill (see the module's flow)."""
    policy = cycle.policy
    fleet = cycle.fleet
    tenant = cycle.tenants.get(req.tenant_id)
    if tenant is not None and tenant.budget_exhausted:
        blocker = tenant.blocker or Blocker(BUDGET_EXCEEDED)
        return wait(cycle, req, words(blocker), capacity=False)
    excluded: tuple[str, ...] = ()
    quota = cycle.quota
    if quota.has_rules(req.tenant_id):
        over = quota.check(req, req.region)
        if over is not None:
            is_reject, why_over = over
            if is_reject:
                return reject(cycle, req, why_over)
            return wait(cycle, req, why_over, capacity=False)
        if req.region is None:
            over_in: list[str] = []
            why_over = ""
            for pool in fleet.pools_by_model.get(req.gpu_model, ()):
                if pool.region in over_in:
                    continue
                over = quota.check(req, pool.region)
                if over is not None:
                    over_in.append(pool.region)
                    why_over = why_over or over[1]
            pools_left = [
                p for p in fleet.pools_by_model.get(req.gpu_model, ()) if p.region not in over_in
            ]
            if not pools_left:
                return wait(cycle, req, why_over, capacity=False)
            excluded = tuple(over_in)
    model = req.gpu_model
    if policy.head_of_line and not policy.backfill and cycle.is_blocked(req):
        return wait(cycle, req, f"waiting behind an earlier {model} request")
    if req.pinned_host is not None:
        return admit_pinned(cycle, req)
    if req.pool:
        return admit_pooled(cycle, req, excluded)
    pools_key = (model, req.region, excluded)
    pools = cycle.pool_cache.get(pools_key)
    if pools is None:
        pools = cycle.pool_cache[pools_key] = [
            p
            for p in fleet.pools_by_model.get(model, ())
            if (req.region is None or p.region == req.region) and p.region not in excluded
        ]
    # Capacity only shrinks within a cycle, so once a shape failed, any request
    # at least as large (per resource) fails too: remember the minimal failures.
    # a share's room depends on its tenant (tenant isolation), a whole GPU's does not
    key = (model, req.region, req.tenant_id if req.gpus_per_node == 0 else None, excluded)
    shape = (
        req.gpus_per_node or req.gpu_milli,
        req.nodes,
        req.vcpus,
        req.memory_mib,
        INF if req.expected_duration is None else req.expected_duration,
    )
    no_room = _dominated(cycle.failed_shapes.get(key), shape)
    if no_room is None:
        found = find(cycle, req, pools)
        if isinstance(found, tuple):
            commit(cycle, req, found)
            return True
        no_room = found
        cycle.failed_shapes.setdefault(key, []).append((shape, no_room))
    # no room now: preempt lower classes, or wait for victims already under notice
    capped: str | None = ""
    if may_preempt(cycle):
        notice = cycle.under_notice.get(req.request_id)
        pending = [a for a in notice if a.doomed] if notice else None
        if pending:
            reserve_hosts_of(cycle, req, pending)
            return wait(cycle, req, f"waiting for {victim_words(pending)} to stop", capacity=False)
        victims_key = (*key, CLASS_RANK.get(req.priority, 1))
        victim_shape = (*shape, time_slice_key(cycle, req))
        capped = known_no_victims(cycle, victims_key, victim_shape)
        if capped is None:
            cap = BlastRadius(req, policy.preempt_cap, cycle.now)
            victims = find_victims(cycle, req, pools, cap)
            if victims:
                give_notice(cycle, req, victims)
                return wait(
                    cycle, req, f"waiting for {victim_words(victims)} to stop", capacity=False
                )
            # victims only ever get fewer within a cycle, so this shape stays unservable
            capped = cap.words(req)
            cycle.no_victims.setdefault(victims_key, []).append((victim_shape, capped))
    # the words only now that the request waits for room (before reserve(), which
    # moves the reserved start that a "reserved" reason names)
    failure = why(cycle, req, no_room.fails, no_room.examined)
    if capped:
        failure = f"{failure}; {capped}"
    if not cycle.is_blocked(req):
        cycle.blocked[(model, req.region)] = req.request_id
        if policy.backfill:
            reserve(cycle, req, pools)
    return wait(cycle, req, failure)


def admit_pooled(cycle: CycleState, req: PlacementRequest, excluded: tuple[str, ...]) -> bool:
    """A batch pool's job: placed on a host of the pool's members (``BatchPoolFilter`` in
    the walk) or it waits for a member, with that reason. It neither preempts nor reserves
    nor blocks the head of the line: the pool's members are its capacity, and while none has
    room, nothing outside the pool is what it waits for."""
    if not req.pool_hosts:
        return wait(
            cycle, req, f"waiting for a member of batch pool {req.pool} to run "
            "(its jobs run only on its members' hosts)", capacity=False,
        )
    pools = [
        p
        for p in cycle.fleet.pools_by_model.get(req.gpu_model, ())
        if (req.region is None or p.region == req.region) and p.region not in excluded
    ]
    found = find(cycle, req, pools)
    if isinstance(found, tuple):
        commit(cycle, req, found)
        return True
    n = len(req.pool_hosts)
    return wait(
        cycle, req, f"waiting for {what(req)} on the hosts of batch pool {req.pool}'s members "
        f"({plural(n, 'host')})", capacity=False,
    )


def admit_pinned(cycle: CycleState, req: PlacementRequest) -> bool:
    """Host affinity: the request goes on ``req.pinned_host`` or waits for it.

    Every filter runs on that one host (no index walk). When it does not fit, a
    dynamic class may preempt lower-class work there; otherwise it waits, and under
    backfill holds the host from the time its running work is expected to end.
    """
    host = req.pinned_host
    assert host is not None
    now = cycle.now
    hs = cycle.fleet.host_slice(host, req.gpu_model)
    because = f", {req.pinned_because}," if req.pinned_because else ""
    reason = f"waiting for host {req.pinned_host_name or host}{because} to have {what(req)}"
    if hs is not None:
        for flt in cycle.filters:
            if not flt.filter(req, hs).ok:
                break
        else:
            commit(cycle, req, (hs,))
            return True
        if hs.ready and may_preempt(cycle):
            pending = [a for a in cycle.under_notice.get(req.request_id, ()) if a.doomed]
            if pending:
                return wait(
                    cycle, req, f"waiting for {victim_words(pending)} to stop", capacity=False
                )
            if hs.reserved_at is None or hs.reserved_for == req.request_id:
                cap = BlastRadius(req, cycle.policy.preempt_cap, now)
                victims = host_victims(cycle, req, hs, cap)
                if victims:
                    mark_reserved(cycle, hs, now, req.request_id)
                    give_notice(cycle, req, victims)
                    return wait(
                        cycle, req, f"waiting for {victim_words(victims)} to stop", capacity=False
                    )
                capped = cap.words(req)
                if capped:
                    reason = f"{reason}; {capped}"
        if cycle.policy.backfill and hs.ready and hs.reserved_at is None:
            at = earliest_fit(cycle, req, hs)
            if at < INF:
                mark_reserved(cycle, hs, at, req.request_id)
    return wait(cycle, req, reason)
