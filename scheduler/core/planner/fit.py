"""Would a request fit on a host now, or once some running work has stopped?

The arithmetic preemption (victims) and backfill (earliest start) share: they
release work on copies of a host's GPU columns and ask again. Placement itself
asks the filters instead (``framework``), over the free-capacity index.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model import WHOLE, HostPlacement, PlacementRequest
from ..state import AllocState, HostState, release_owner, share_open


def release(
    hs: HostState,
    whole: list[bool],
    milli: list[int],
    owner: list[str | None],
    placements: Sequence[HostPlacement],
) -> None:
    """Free, in the ``whole``/``milli``/``owner`` copies of ``hs``, the GPUs these
    placements hold there."""
    pos = hs.pos
    for p in placements:
        if p.host_id != hs.host_id:
            continue
        for u in p.gpus:
            i = pos.get(u)
            if i is None:
                continue
            if whole[i]:
                whole[i] = False
                milli[i] = 0
            else:
                milli[i] = max(0, milli[i] - p.milli)
                release_owner(owner, milli, i)


def fits_counts(
    req: PlacementRequest,
    hs: HostState,
    whole: list[bool],
    milli: list[int],
    owner: list[str | None],
    vcpus: int,
    mem: int,
    require_island: bool,
) -> bool:
    """Would ``req`` fit on ``hs`` if its GPUs, their share owners and free
    resources were these?"""
    if vcpus < req.vcpus or mem < req.memory_mib:
        return False
    g = req.gpus_per_node
    if g == 0:
        m = req.gpu_milli
        t = req.tenant_id
        return any(
            not whole[i] and WHOLE - milli[i] >= m and share_open(owner[i], t)
            for i in range(hs.total)
        )
    free = [i for i in range(hs.total) if milli[i] == 0 and not whole[i]]
    if len(free) < g:
        return False
    if g > 1 and require_island:
        per: dict[int, int] = {}
        for i in free:
            per[hs.island[i]] = per.get(hs.island[i], 0) + 1
        if not any(c >= g for c in per.values()) and g <= hs.max_island():
            return False
    return True


def fits_now(req: PlacementRequest, hs: HostState, require_island: bool) -> bool:
    """``fits_with(req, hs, (), ...)`` read straight off the host's counters."""
    res = hs.res
    if res.free_vcpus < req.vcpus or res.free_mem < req.memory_mib:
        return False
    g = req.gpus_per_node
    if g == 0:
        return hs.fits_share(req.gpu_milli, req.tenant_id)
    if hs.free < g:
        return False
    if g > 1 and require_island:
        for c in hs.island_free.values():
            if c >= g:
                return True
        return g > hs.max_island()
    return True


def fits_with(
    req: PlacementRequest, hs: HostState, gone: Sequence[AllocState], require_island: bool
) -> bool:
    """Would ``req`` fit on ``hs`` (ignoring reservations) once ``gone`` stopped?"""
    if not gone:
        return fits_now(req, hs, require_island)
    whole = hs.whole[:]
    milli = hs.milli[:]
    owner = hs.owner[:]
    vcpus = hs.res.free_vcpus
    mem = hs.res.free_mem
    for a in gone:
        al = a.alloc
        vcpus += al.vcpus
        mem += al.memory_mib
        release(hs, whole, milli, owner, al.placements)
    return fits_counts(req, hs, whole, milli, owner, vcpus, mem, require_island)
