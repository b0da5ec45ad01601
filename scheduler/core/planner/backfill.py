"""Reservations (EASY backfill): a blocked head holds the hosts where it can start
earliest, and later work may use them only if it ends before that start
(``ReservationFilter``). Preemption reserves the hosts it frees the same way.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Sequence

from ..model import WHOLE, PlacementRequest
from ..state import INF, Ending, HostState, Pool
from .cycle import CycleState
from .fit import fits_counts, fits_now, release

# the order in which running work is expected to end: by time, ties by request id
_end_order = operator.itemgetter(0, 1)


def mark_reserved(cycle: CycleState, hs: HostState, at: float, request_id: str) -> None:
    """Hold ``hs`` for ``request_id`` from ``at``; the first reservation of the
    cycle adds the reservation filter to the candidate loop."""
    hs.reserved_at = at
    hs.reserved_for = request_id
    if not cycle.any_reserved:
        cycle.any_reserved = True
        cycle.choose_hot_filters()


def earliest_fit(cycle: CycleState, req: PlacementRequest, hs: HostState) -> float:
    """When ``req`` could start on ``hs`` if running work ends as expected."""
    now = cycle.now
    require_island = cycle.require_island
    if fits_now(req, hs, require_island):
        return now
    # what ends here, and when: the snapshot's work, and the work this plan placed
    ends = [
        Ending(a.end, a.alloc.request_id, a.alloc.vcpus, a.alloc.memory_mib, a.alloc.placements, a.gpu_count)
        for a in hs.allocs
        if a.end < INF
    ]
    ends += hs.placed
    if not ends:
        return INF
    if req.gpus_per_node > 0 and hs.free + sum(e.gpus for e in ends) < req.gpus_per_node:
        return INF
    ends.sort(key=_end_order)
    # release the work in the order it ends until the request fits: one pass
    whole = hs.whole[:]
    milli = hs.milli[:]
    owner = hs.owner[:]
    vcpus = hs.res.free_vcpus
    mem = hs.res.free_mem
    for e in ends:
        vcpus += e.vcpus
        mem += e.memory_mib
        release(hs, whole, milli, owner, e.placements)
        if fits_counts(req, hs, whole, milli, owner, vcpus, mem, require_island):
            return max(e.end, now)
    return INF


def reserve(cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool]) -> None:
    """EASY backfill: hold the hosts where the blocked head starts earliest.

    Later work may use those hosts only if it ends before the reserved start
    (ReservationFilter). When no start time is known (open-ended work), the
    hosts closest to fitting are held outright so the head cannot starve.
    """
    if req.nodes > 1 and req.region is None:
        regions = sorted({p.region for p in pools})
        pools = [p for p in pools if p.region == regions[0]] if regions else []
    times: list[tuple[float, str, HostState]] = []
    for pool in pools:
        for hs in pool.hosts:
            if hs.reserved_at is not None or req.gpus_per_node > hs.total:
                continue
            t = earliest_fit(cycle, req, hs)
            if t < INF:
                times.append((t, hs.host_id, hs))
    times.sort(key=lambda x: (x[0], x[1]))
    if len(times) >= req.nodes:
        chosen = times[: req.nodes]
        at = max(t for t, _h, _hs in chosen)
        for _t, _h, hs in chosen:
            mark_reserved(cycle, hs, at, req.request_id)
        cycle.reserved_start[req.gpu_model] = at
        return
    # unknown end times: hold the hosts with the most free GPUs outright
    # nsmallest(n, ...) is sorted(...)[:n] without sorting every host
    best = heapq.nsmallest(
        req.nodes,
        (hs for pool in pools for hs in pool.hosts if hs.reserved_at is None),
        key=lambda hs: (-hs.free, -(WHOLE * hs.total - sum(hs.milli)), hs.host_id),
    )
    for hs in best:
        mark_reserved(cycle, hs, cycle.now, req.request_id)
    cycle.reserved_start[req.gpu_model] = cycle.now
