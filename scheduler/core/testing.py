"""Builders and invariant checks for tests, the simulator and benchmarks
(the core's harness, after Nomad's ``scheduler/tests``).

``apply_plan`` turns a plan into the next snapshot the way the live adapter
would (places become allocations, preempts are marked under notice), so
multi-cycle properties can be checked without Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from .model import (
    SEVERAL_TENANTS,
    WHOLE,
    Allocation,
    ClusterSnapshot,
    GpuView,
    HostView,
    Migrate,
    Place,
    PlacementRequest,
    Plan,
    Preempt,
    Reject,
    Wait,
)


def make_host(
    host_id: str,
    *,
    model: str = "H100",
    gpus: int = 8,
    region: str = "r1",
    island_size: int = 8,
    numa_size: int = 4,
    ready: bool = True,
    vcpus: int = 128,
    memory_mib: int = 1024 * 1024,
    whole: Iterable[int] = (),
    shares: dict[int, int] | None = None,
    util: float = 0.0,
    idle_since: float | None = None,
    share_tenant: str | None = "t1",
    cross_tenant: bool = False,
) -> HostView:
    """A host whose GPUs ``whole`` are held whole and ``shares`` {index: milli} shared
    (by ``share_tenant``, the default tenant of ``make_request``); ``cross_tenant``
    opens all its GPUs to shares of several tenants."""
    held = set(whole)
    sh = shares or {}
    return HostView(
        host_id=host_id,
        region=region,
        ready=ready,
        gpus=tuple(
            GpuView(
                uuid=f"{host_id}-g{i}",
                index=i,
                model=model,
                nvlink_island=i // island_size,
                numa_node=i // numa_size,
                whole=i in held,
                used_milli=sh.get(i, 0),
                utilisation=util,
                idle_since=idle_since,
                share_tenant=share_tenant if sh.get(i, 0) else None,
                cross_tenant=cross_tenant,
            )
            for i in range(gpus)
        ),
        free_vcpus=vcpus,
        free_memory_mib=memory_mib,
        total_vcpus=vcpus,
        total_memory_mib=memory_mib,
    )


def make_request(request_id: str, **kw: object) -> PlacementRequest:
    kw.setdefault("tenant_id", "t1")
    kw.setdefault("gpu_model", "H100")
    return PlacementRequest(request_id=request_id, **kw)  # type: ignore[arg-type]


def occupy(snapshot: ClusterSnapshot, allocs: Sequence[Allocation]) -> ClusterSnapshot:
    """Add running allocations and mark their GPUs, vCPUs and memory used."""
    hosts = {h.host_id: h for h in snapshot.hosts}
    for a in allocs:
        for p in a.placements:
            h = hosts[p.host_id]
            gpus = []
            for g in h.gpus:
                if g.uuid in p.gpus:
                    if p.milli >= WHOLE:
                        g = replace(g, whole=True, used_milli=0)
                    else:
                        t: str | None = a.tenant_id
                        if g.used_milli and g.share_tenant != a.tenant_id:
                            t = SEVERAL_TENANTS  # a broken rule shows, verify() catches it
                        g = replace(g, used_milli=g.used_milli + p.milli, share_tenant=t)
                gpus.append(g)
            hosts[p.host_id] = replace(
                h,
                gpus=tuple(gpus),
                free_vcpus=h.free_vcpus - a.vcpus,
                free_memory_mib=h.free_memory_mib - a.memory_mib,
            )
    return replace(
        snapshot,
        hosts=tuple(hosts[h.host_id] for h in snapshot.hosts),
        allocations=snapshot.allocations + tuple(allocs),
    )


def release(snapshot: ClusterSnapshot, request_ids: Iterable[str]) -> ClusterSnapshot:
    """Remove allocations (they stopped) and give their capacity back."""
    gone = set(request_ids)
    hosts = {h.host_id: h for h in snapshot.hosts}
    for a in snapshot.allocations:
        if a.request_id not in gone:
            continue
        for p in a.placements:
            h = hosts[p.host_id]
            gpus = []
            for g in h.gpus:
                if g.uuid in p.gpus:
                    if p.milli >= WHOLE:
                        g = replace(g, whole=False, used_milli=0)
                    else:
                        left = max(0, g.used_milli - p.milli)
                        g = replace(
                            g, used_milli=left, share_tenant=g.share_tenant if left else None
                        )
                gpus.append(g)
            hosts[p.host_id] = replace(
                h,
                gpus=tuple(gpus),
                free_vcpus=h.free_vcpus + a.vcpus,
                free_memory_mib=h.free_memory_mib + a.memory_mib,
            )
    return replace(
        snapshot,
        hosts=tuple(hosts[h.host_id] for h in snapshot.hosts),
        allocations=tuple(a for a in snapshot.allocations if a.request_id not in gone),
    )


def apply_plan(
    snapshot: ClusterSnapshot,
    queue: Sequence[PlacementRequest],
    plan: Plan,
    *,
    now: float,
) -> tuple[ClusterSnapshot, tuple[PlacementRequest, ...]]:
    """The next (snapshot, queue): places run, preempts are under notice until
    ``now + notice``, waits stay queued, rejects leave."""
    by_id = {r.request_id: r for r in queue}
    new: list[Allocation] = []
    done: set[str] = set()
    for d in plan.decisions:
        if isinstance(d, Place):
            r = by_id[d.request_id]
            done.add(r.request_id)
            new.append(
                Allocation(
                    request_id=r.request_id,
                    tenant_id=r.tenant_id,
                    placements=d.placements,
                    gpu_model=r.gpu_model,
                    priority=r.priority,
                    billing=r.billing,
                    kind=r.kind,
                    started_at=now,
                    expected_end=None if r.expected_duration is None else now + r.expected_duration,
                    restartable=r.restartable,
                    vcpus=r.vcpus,
                    memory_mib=r.memory_mib,
                    pinned=r.pinned_host is not None,
                )
            )
        elif isinstance(d, Reject):
            done.add(d.request_id)
    preempts = {d.victim_id: d for d in plan.decisions if isinstance(d, Preempt)}
    if preempts:
        snapshot = replace(
            snapshot,
            allocations=tuple(
                replace(
                    a,
                    preempting=True,
                    preempting_for=preempts[a.request_id].because_request_id,
                    stop_by=now + preempts[a.request_id].notice_s,
                )
                if a.request_id in preempts
                else a
                for a in snapshot.allocations
            ),
        )
    snapshot = occupy(snapshot, new)
    return snapshot, tuple(r for r in queue if r.request_id not in done)


def verify(
    snapshot: ClusterSnapshot,
    queue: Sequence[PlacementRequest],
    plan: Plan,
) -> None:
    """Assert the invariants every plan keeps; raises AssertionError with a reason."""
    by_id = {r.request_id: r for r in queue}
    hosts = {h.host_id: h for h in snapshot.hosts}
    whole: dict[str, bool] = {}
    milli: dict[str, int] = {}
    owner: dict[str, str | None] = {}  # tenant isolation: whose shares a closed GPU carries
    cross: dict[str, bool] = {}
    for h in snapshot.hosts:
        for g in h.gpus:
            whole[g.uuid] = g.whole
            milli[g.uuid] = g.used_milli
            cross[g.uuid] = g.cross_tenant
            owner[g.uuid] = (g.share_tenant or SEVERAL_TENANTS) if g.used_milli else None
    vcpus = {h.host_id: h.free_vcpus for h in snapshot.hosts}
    mem = {h.host_id: h.free_memory_mib for h in snapshot.hosts}
    seen: dict[str, int] = {}
    for d in plan.decisions:
        if isinstance(d, Place | Wait | Reject):
            seen[d.request_id] = seen.get(d.request_id, 0) + 1
        if isinstance(d, Migrate):
            for p in d.to:
                for u in p.gpus:
                    assert not whole[u] and milli[u] == 0, f"migration onto busy GPU {u}"
                    whole[u] = True
        if not isinstance(d, Place):
            continue
        r = by_id[d.request_id]
        assert len(d.placements) == r.nodes, f"{r.request_id}: gang split"
        assert len({p.host_id for p in d.placements}) == r.nodes, "gang reuses a host"
        regions = {hosts[p.host_id].region for p in d.placements}
        assert len(regions) == 1, "gang spans regions"
        if r.region is not None:
            assert regions == {r.region}, "placed outside the asked region"
        for p in d.placements:
            h = hosts[p.host_id]
            assert h.ready, "placed on a host that is not ready"
            models = {g.uuid: g.model for g in h.gpus}
            if r.gpus_per_node > 0:
                assert len(p.gpus) == r.gpus_per_node and p.milli == WHOLE
                assert len(set(p.gpus)) == len(p.gpus), "same GPU twice in one placement"
                for u in p.gpus:
                    assert models[u] == r.gpu_model
                    assert not whole[u] and milli[u] == 0, f"{u} booked twice"
                    whole[u] = True
            else:
                assert len(p.gpus) == 1 and p.milli == r.gpu_milli
                u = p.gpus[0]
                assert models[u] == r.gpu_model
                assert not whole[u], f"share on whole-held GPU {u}"
                milli[u] += p.milli
                assert milli[u] <= WHOLE, f"shares on {u} exceed 1000"
                if not cross[u]:
                    assert owner[u] in (None, r.tenant_id), (
                        f"{u} carries shares of {owner[u]!r} and {r.tenant_id!r}"
                    )
                    owner[u] = r.tenant_id
            vcpus[p.host_id] -= r.vcpus
            mem[p.host_id] -= r.memory_mib
            assert vcpus[p.host_id] >= 0 and mem[p.host_id] >= 0, "host over CPU/memory"
    for rid in by_id:
        assert seen.get(rid) == 1, f"{rid} got {seen.get(rid, 0)} decisions"
