"""The stages after the queue, for dynamic classes: reclaim idle GPUs from work
that holds them, and suggest moves that free whole hosts (defragmentation)."""

from __future__ import annotations

from ..model import WHOLE, HostPlacement, Migrate, PlacementRequest, Preempt
from ..plugins import pick_whole
from ..state import INF
from .cycle import CycleState


def reclaim(cycle: CycleState) -> None:
    """Dynamic classes: work whose GPUs all stayed below the utilisation
    threshold for ``reclaim_idle_s`` gets a Preempt with notice - only while
    requests for that GPU model wait, when ``reclaim_under_pressure``."""
    policy = cycle.policy
    fleet = cycle.fleet
    now = cycle.now
    demand = dict(cycle.waiting_milli)
    if policy.reclaim_under_pressure and not any(v > 0 for v in demand.values()):
        return
    for rid in sorted(fleet.allocs):
        a = fleet.allocs[rid]
        al = a.alloc
        if a.doomed or policy.mode_for(al.priority) != "dynamic":
            continue
        model = fleet.model_of(al)
        if policy.reclaim_under_pressure and demand.get(model, 0) <= 0:
            continue
        # bounded blast radius: never reclaim more than the cap times what waits
        if policy.reclaim_under_pressure and a.milli > policy.preempt_cap * demand.get(model, 0):
            continue
        idle_for = INF
        any_gpu = False
        for pl in al.placements:
            for hs in fleet.slices.get(pl.host_id, ()):
                for u in pl.gpus:
                    i = hs.pos.get(u)
                    if i is None:
                        continue
                    any_gpu = True
                    since = hs.idle_since[i]
                    if hs.util[i] >= policy.reclaim_idle_util or since is None:
                        idle_for = -INF
                    else:
                        idle_for = min(idle_for, now - since)
        if not any_gpu or idle_for < policy.reclaim_idle_s:
            continue
        a.doomed = True
        demand[model] = demand.get(model, 0) - a.milli
        cycle.decisions.append(
            Preempt(
                rid,
                None,
                policy.notice_s,
                f"reclaimed: GPUs below {policy.reclaim_idle_util:.0%} utilisation for "
                f"{idle_for / 3600:.1f} h while others wait",
            )
        )
        cycle.counts["reclaimed"] += 1


def defragment(cycle: CycleState) -> None:
    """Suggest moving restartable single-host whole-GPU work that sits alone on
    a host onto a host that is already partly used, so whole hosts free up for
    large gangs. Capacity on the target is booked; the source is freed only
    when the move is applied."""
    policy = cycle.policy
    fleet = cycle.fleet
    done = 0
    for rid in sorted(fleet.allocs):
        if done >= policy.max_migrations:
            break
        a = fleet.allocs[rid]
        al = a.alloc
        if (
            a.doomed
            or not al.restartable
            or al.pinned
            or len(al.placements) != 1
            or al.placements[0].milli != WHOLE
            or policy.mode_for(al.priority) != "dynamic"
        ):
            continue
        src = al.placements[0]
        model = fleet.model_of(al)
        hs = fleet.host_slice(src.host_id, model)
        g = len(src.gpus)
        if hs is None or hs.pool is None or len(hs.allocs) != 1 or hs.total - hs.free != g:
            continue
        probe = PlacementRequest(
            request_id=rid,
            tenant_id=al.tenant_id,
            gpu_model=model,
            gpus_per_node=g,
            vcpus=al.vcpus,
            memory_mib=al.memory_mib,
            region=hs.region,
            expected_duration=None if al.expected_end is None else al.expected_end - cycle.now,
        )
        target = None
        for c in range(g, hs.pool.max_gpus):
            for cand in hs.pool.by_free[c]:
                if cand is hs or cand.free == cand.total:
                    continue
                if all(f.filter(probe, cand).ok for f in cycle.hot_filters):
                    target = cand
                    break
            if target is not None:
                break
        if target is None:
            continue
        idxs = pick_whole(target, g)
        assert idxs is not None
        target.pool.take_whole(target, idxs)  # type: ignore[union-attr]
        target.res.free_vcpus -= al.vcpus
        target.res.free_mem -= al.memory_mib
        target.scores = None
        a.doomed = True
        cycle.decisions.append(
            Migrate(
                rid,
                al.placements,
                (HostPlacement(target.host_id, tuple(target.uuids[i] for i in idxs), WHOLE),),
                f"defragment: frees host {hs.host_id} for larger requests",
            )
        )
        cycle.counts["migrations"] += 1
        done += 1
