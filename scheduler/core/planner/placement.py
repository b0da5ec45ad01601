"""Placement: find hosts for a request and book them (Nomad's feasible, rank and
select; kube-scheduler's Filter and Score).

    find ─▶ find_in ─▶ candidates (walk the free-capacity index, run the hot
                       filters) ─▶ rank by (-weighted score, host_id) ─▶ hosts
      └── none fit: NoRoom (filter failures, hosts examined) ─▶ why (words)
    commit: take the GPUs, vCPUs and memory on the in-memory views, emit Place

The hot loops are written out flat and bind what they read to locals: they run
for every host examined of every request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

from ..blockers import Blocker, needs_words, no_capacity, words
from ..framework import OK
from ..model import WHOLE, HostPlacement, Place, PlacementRequest
from ..plugins import pick_share, pick_whole
from ..state import N_SHARE_BUCKETS, SHARE_BUCKET, Ending, HostState, Pool
from .cycle import CycleState, NoRoom
from .words import gib


def _score_and_host_id(ranked: tuple[int, str, HostState]) -> tuple[int, str]:
    return ranked[0], ranked[1]


def what(req: PlacementRequest) -> str:
    """What ``req`` needs free on one host, in words."""
    return needs_words(gpu_model=req.gpu_model, gpus=req.gpus_per_node, share_milli=req.gpu_milli)


def candidates(
    cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool], need: int
) -> tuple[list[HostState], Counter[str] | None, int]:
    """Walk the index buckets that can hold ``req`` and return up to ``need``
    hosts passing every filter, plus why the others failed."""
    out: list[HostState] = []
    fails: Counter[str] | None = None
    examined = 0
    limit = cycle.policy.scan_limit
    g = req.gpus_per_node
    hot = (
        cycle.hot_filters
        if g == 0
        else cycle.hot_filters_one_gpu
        if g == 1
        else cycle.hot_filters_multi_gpu
    )
    if g > 0 and cycle.placement_spec.scan == "fullest":
        # the common case, walked inline (no generator): hosts with >= g free
        # GPUs, fewest free first
        top = max([p.max_gpus for p in pools], default=0)
        if g == 1 and cycle.resources_filter_only:
            vcpus = req.vcpus
            mem = req.memory_mib
            for c in range(1, top + 1):
                for pool in pools:
                    if c >= len(pool.by_free):
                        continue
                    for hs in pool.by_free[c]:
                        examined += 1
                        res = hs.res
                        if res.free_vcpus < vcpus or res.free_mem < mem:
                            if fails is None:
                                fails = Counter()
                            fails["resources"] += 1
                        else:
                            out.append(hs)
                            if len(out) >= need:
                                return out, fails, examined
                        if examined >= limit:
                            return out, fails, examined
            return out, fails, examined
        for c in range(g, top + 1):
            for pool in pools:
                if c >= len(pool.by_free):
                    continue
                for hs in pool.by_free[c]:
                    examined += 1
                    for flt in hot:
                        st = flt.filter(req, hs)
                        if st is not OK and st.code:
                            if fails is None:
                                fails = Counter()
                            fails[flt.name] += 1
                            break
                    else:
                        out.append(hs)
                        if len(out) >= need:
                            return out, fails, examined
                    if examined >= limit:
                        return out, fails, examined
        return out, fails, examined
    for hs in walk(cycle, req, pools):
        examined += 1
        for flt in hot:
            st = flt.filter(req, hs)
            if st is not OK and st.code:
                if fails is None:
                    fails = Counter()
                fails[flt.name] += 1
                break
        else:
            out.append(hs)
            if len(out) >= need:
                break
        if examined >= limit:
            break
    return out, fails, examined


def walk(cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool]) -> Iterator[HostState]:
    """Hosts from the index buckets that can hold ``req``, in scan order.

    Whole GPUs: buckets of hosts with >= g free GPUs, fewest first (packing)
    or most first (spreading). Shares: GPUs already carrying shares with
    enough room (packing shares together), then hosts with a free GPU.
    The caller must stop iterating before it changes the index.
    """
    g = req.gpus_per_node
    fullest = cycle.placement_spec.scan == "fullest"
    top = max([p.max_gpus for p in pools], default=0)
    if g > 0:
        for c in range(g, top + 1) if fullest else range(top, g - 1, -1):
            for pool in pools:
                if c < len(pool.by_free):
                    yield from pool.by_free[c]
        return
    m = req.gpu_milli
    if m == 0:
        # no GPU: any host, fullest (fewest free GPUs) first when packing
        for c in range(0, top + 1) if fullest else range(top, -1, -1):
            for pool in pools:
                if c < len(pool.by_free):
                    yield from pool.by_free[c]
        return
    tenant = req.tenant_id
    seen: set[HostState] = set()
    lo = m // SHARE_BUCKET
    shared_order = (
        range(lo, N_SHARE_BUCKETS) if fullest else range(N_SHARE_BUCKETS - 1, lo - 1, -1)
    )
    fresh_order = range(1, top + 1) if fullest else range(top, 0, -1)
    for phase in ("shared", "fresh") if fullest else ("fresh", "shared"):
        if phase == "shared":
            # tenant isolation by layout: only the buckets of GPUs open to every
            # tenant and of GPUs whose shares are this tenant's (share_open)
            for b in shared_order:
                for pool in pools:
                    for owner in (None, tenant):
                        buckets = pool.shared.get(owner)
                        if buckets is None:
                            continue
                        for hs, i in buckets[b]:
                            if hs in seen or WHOLE - hs.milli[i] < m:
                                continue
                            seen.add(hs)
                            yield hs
        else:
            for c in fresh_order:
                for pool in pools:
                    if c < len(pool.by_free):
                        for hs in pool.by_free[c]:
                            if hs not in seen:
                                seen.add(hs)
                                yield hs


def find(
    cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool]
) -> tuple[HostState, ...] | NoRoom:
    """The hosts to use (one per node), or why none fit (filter failures and
    hosts examined, turned into words by ``why``)."""
    if req.nodes > 1 and req.region is None:
        # a gang stays in one region: try regions in name order
        fails: Counter[str] = Counter()
        examined = 0
        for region in sorted({p.region for p in pools}):
            got = find_in(cycle, req, [p for p in pools if p.region == region])
            if isinstance(got, tuple):
                return got
            fails.update(got.fails)
            examined += got.examined
        return NoRoom(fails, examined)
    return find_in(cycle, req, pools)


def find_in(
    cycle: CycleState, req: PlacementRequest, pools: Sequence[Pool]
) -> tuple[HostState, ...] | NoRoom:
    """``find`` within pools of one region (or of any region for one node)."""
    nodes = req.nodes
    feasible, fails, examined = candidates(cycle, req, pools, max(cycle.hosts_to_score, nodes))
    cycle.counts["examined"] += examined
    if len(feasible) < nodes:
        return NoRoom(fails if fails is not None else Counter(), examined)
    scores = cycle.scores
    if scores and len(feasible) > nodes:
        # rank by (-weighted score, host_id); written out flat, it is the hot loop
        # Scores depend only on the request's shape and the host, so a host's
        # total is cached until something lands on it: the runners-up of one
        # request are usually the candidates of the next.
        shape = (
            req.gpus_per_node,
            req.gpu_milli,
            req.vcpus,
            req.memory_mib,
            # a share's GPU pick (and so its score) depends on its tenant
            req.tenant_id if req.gpus_per_node == 0 else None,
        )
        ranked = []
        best: HostState | None = None
        best_total = 0
        for hs in feasible:
            cache = hs.scores
            if cache is None:
                cache = hs.scores = {}
            total = cache.get(shape)
            if total is None:
                total = 0
                for sc in scores:
                    total += sc.weight * sc.score(req, hs)
                cache[shape] = total
            if nodes == 1:
                # min over (-total, host_id) without building the tuples
                if (
                    best is None
                    or total > best_total
                    or (total == best_total and hs.host_id < best.host_id)
                ):
                    best, best_total = hs, total
            else:
                ranked.append((-total, hs.host_id, hs))
        if best is not None:
            return (best,)
        ranked.sort(key=_score_and_host_id)
        return tuple(r[2] for r in ranked[:nodes])
    return tuple(feasible[:nodes])


def why(cycle: CycleState, req: PlacementRequest, fails: Counter[str], examined: int) -> str:
    """Why no host has room for ``req``, in words: the filter most hosts failed."""
    where = f" in {req.region}" if req.region else ""
    needs = what(req)
    subject = "no host" if req.nodes == 1 else f"fewer than {req.nodes} hosts"
    verb = "has" if req.nodes == 1 else "have"
    if examined == 0 or not fails:
        return words(_no_capacity(req))
    top = max(fails.items(), key=lambda kv: (kv[1], kv[0]))[0]
    if top == "resources":
        return (
            f"{subject}{where} with {needs} {verb} {req.vcpus} vCPUs and "
            f"{gib(req.memory_mib)} GiB memory free"
        )
    if top == "nvlink":
        return f"{subject}{where} {verb} {needs} on one NVLink island"
    if top == "reservation":
        now = cycle.now
        at = cycle.reserved_start.get(req.gpu_model)
        when = f" (starting in {max(at - now, 0):.0f} s)" if at is not None and at > now else ""
        return f"the free {req.gpu_model} GPUs are reserved for an earlier request{when}"
    if top == "gpus":
        return words(_no_capacity(req))
    return f"{subject}{where} {verb} {needs} ({top})"


def _no_capacity(req: PlacementRequest) -> Blocker:
    """The admission answer "no free GPUs now" (``blockers``: the console's box says the same)."""
    return no_capacity(region=req.region, gpu_model=req.gpu_model, gpus=req.gpus_per_node,
                       share_milli=req.gpu_milli, nodes=req.nodes)


def commit(cycle: CycleState, req: PlacementRequest, hosts: tuple[HostState, ...]) -> None:
    """Book ``req`` on ``hosts`` (one per node) and emit its Place."""
    out: list[HostPlacement] = []
    g = req.gpus_per_node
    slices = cycle.fleet.slices
    for hs in hosts:
        pool = hs.pool
        assert pool is not None
        uuids = hs.uuids
        if g > 0:
            idxs = pick_whole(hs, g)
            assert idxs is not None
            pool.take_whole(hs, idxs)
            out.append(HostPlacement(hs.host_id, tuple([uuids[i] for i in idxs]), WHOLE))
        elif req.gpu_milli == 0:
            out.append(HostPlacement(hs.host_id, (), 0))  # no GPU: vCPUs and memory only
        else:
            if cycle.fgd is not None and cycle.placement_spec.share_pick == "fgd":
                got = cycle.fgd.best_share(hs, req.gpu_milli, req.vcpus, req.tenant_id)
                i = None if got is None else got[0]
            else:
                i = pick_share(
                    hs,
                    req.gpu_milli,
                    cycle.placement_spec.share_pick,
                    cycle.mix,
                    cycle.fragmentation,
                    tenant=req.tenant_id,
                )
            assert i is not None
            pool.take_share(hs, i, req.gpu_milli, req.tenant_id)
            out.append(HostPlacement(hs.host_id, (uuids[i],), req.gpu_milli))
        res = hs.res
        res.free_vcpus -= req.vcpus
        res.free_mem -= req.memory_mib
        host_slices = slices[hs.host_id]
        if len(host_slices) == 1:
            hs.scores = None
        else:
            for sl in host_slices:
                sl.scores = None
    placements = tuple(out)
    if req.expected_duration is not None:
        # A reservation computed later in this cycle must see this work end, exactly as
        # the next cycle will see it as an allocation; otherwise a head blocked behind
        # it holds hosts outright now and other hosts next cycle.
        ending = Ending(
            cycle.now + req.expected_duration,
            req.request_id,
            req.vcpus,
            req.memory_mib,
            placements,
            (g or 1) * req.nodes,
        )
        for hs in hosts:
            hs.placed.append(ending)
    backfilled = bool(cycle.blocked) and cycle.is_blocked(req)
    cycle.decisions.append(Place(req.request_id, placements, backfilled))
    if cycle.quota.rules:
        cycle.quota.charge(req, hosts[0].region)
    counts = cycle.counts
    counts["placed"] += 1
    counts["placed_gpu_milli"] += (g * WHOLE if g else req.gpu_milli) * req.nodes
    if backfilled:
        counts["backfilled"] += 1
