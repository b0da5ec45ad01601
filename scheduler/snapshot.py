"""ORM → the core's plain data: one region's fleet, running work, tenants and queue.

A handful of queries per cycle, whatever the fleet size: hosts, GPUs, active
allocations with their workloads, pending workloads, tenants' quotas and usage.
Values come out of the database as tuples (`values_list`), not model instances:
at 100,000 GPUs building model objects alone would cost seconds.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Q, Sum

from agents.choices import HostState
from agents.models import Gpu, Host
from gpucloud.catalogue.models import GpuModel, InstanceType, Quota, Region
from gpucloud.lib.db import Epoch
from gpucloud.tenancy.models import Tenant
from scheduler import bulk, core, hooks
from scheduler.choices import HOLDING, State, WorkloadKind
from scheduler.core import blockers
from scheduler.core.quota import quota_applies
from scheduler.models import Allocation, Workload


@dataclass(frozen=True)
class CycleInput:
    snapshot: core.ClusterSnapshot
    queue: tuple[core.PlacementRequest, ...]
    # what apply needs that the core does not: per request, what the user sees now
    # (reason, queue position) and its GPU model
    shown: dict[str, tuple[str, int | None]]
    gpu_model_of: dict[str, str]


def build(*, region_id: int) -> CycleInput:
    """Everything one cycle of `region_id` needs. Regions are named by code in the core."""
    code = Region.objects.values_list("code", flat=True).get(pk=region_id)
    allocations = _allocations(region_id)
    hosts = _hosts(region_id, code, share_tenants(allocations))
    queue, reasons, models = _queue(region_id, code)
    tenant_ids = {r.tenant_id for r in queue} | {a.tenant_id for a in allocations}
    tenants = tenant_views(tenant_ids)
    snapshot = core.ClusterSnapshot(hosts=hosts, allocations=allocations, tenants=tenants)
    return CycleInput(snapshot=snapshot, queue=queue, shown=reasons, gpu_model_of=models)


def share_tenants(allocations: tuple[core.Allocation, ...]) -> dict[str, str]:
    """GPU uuid -> the tenant whose fractional shares it carries (tenant isolation);
    ``core.SEVERAL_TENANTS`` where shares of several tenants already sit on one GPU
    (an open GPU, or one shared before the rule: the core adds nobody's to it while closed)."""
    out: dict[str, str] = {}
    for a in allocations:
        for p in a.placements:
            if p.milli >= core.WHOLE:
                continue
            for u in p.gpus:
                t = out.get(u)
                out[u] = a.tenant_id if t is None or t == a.tenant_id else core.SEVERAL_TENANTS
    return out


def _hosts(region_id: int, code: str, tenants: dict[str, str] | None = None) -> tuple[core.HostView, ...]:
    """The region's hosts; ``tenants`` (from ``share_tenants``) names whose shares each GPU carries."""
    tenants = tenants or {}
    host_rows = list(
        Host.objects.filter(region_id=region_id)
        .values_list("id", "state", "vcpus", "memory_mib", "used_vcpus", "used_memory_mib")
    )
    gpus: dict[str, list[core.GpuView]] = defaultdict(list)
    for (uuid, host_id, index, model, island, numa, whole, used, util, idle, healthy,
         cross) in _gpu_rows(region_id):
        if not healthy and not whole and not used:
            continue  # a broken GPU takes no new work; a booked one still shows its booking
        gpus[host_id].append(core.GpuView(
            uuid=uuid, index=index, model=model, nvlink_island=island, numa_node=numa,
            whole=whole, used_milli=used, utilisation=util, idle_since=idle,
            # tenant isolation: several tenants' shares only on models the operator opened
            # (GpuModel.allow_cross_tenant_sharing). A MIG GPU (Gpu.mig_enabled) is NOT opened
            # yet: shares are still pinned to the parent GPU UUID, which exposes every MIG
            # slice of it to the container; it opens once a share is pinned to its own slice.
            share_tenant=tenants.get(uuid) if used and not whole else None, cross_tenant=cross,
        ))
    return tuple(
        core.HostView(
            host_id=str(host_id), region=code, ready=state == HostState.READY,
            gpus=tuple(gpus.get(str(host_id), ())), free_vcpus=vcpus - used_vcpus,
            free_memory_mib=mem - used_mem, total_vcpus=vcpus, total_memory_mib=mem,
        )
        for host_id, state, vcpus, mem, used_vcpus, used_mem in host_rows
    )


_GPUS_SQL = """
SELECT g.uuid, g.host_id::text, g.index, m.code, g.nvlink_island, g.numa_node, g.whole, g.used_milli,
       g.utilisation, EXTRACT(EPOCH FROM g.idle_since)::float8, g.healthy,
       m.allow_cross_tenant_sharing
FROM {gpu} g
JOIN {host} h ON h.id = g.host_id
JOIN {model} m ON m.id = g.gpu_model_id
WHERE h.region_id = %s
ORDER BY g.host_id, g.index
"""


def _gpu_rows(region_id: int):
    """The region's GPUs in host order; host ids as text on PostgreSQL (see `_allocation_rows`)."""
    if connection.vendor == "postgresql":
        sql = _GPUS_SQL.format(gpu=Gpu._meta.db_table, host=Host._meta.db_table, model=GpuModel._meta.db_table)
        with bulk.pg_cursor() as cur:
            cur.execute(sql, [region_id])
            yield from cur
        return
    for uuid, host_id, *rest in (
        Gpu.objects.filter(host__region_id=region_id)
        .annotate(idle_s=Epoch("idle_since"))
        .values_list("uuid", "host_id", "index", "gpu_model__code", "nvlink_island", "numa_node",
                     "whole", "used_milli", "utilisation", "idle_s", "healthy",
                     "gpu_model__allow_cross_tenant_sharing")
        .order_by("host_id", "index")
    ):
        yield (uuid, str(host_id), *rest)


_ALLOCATIONS_SQL = """
SELECT a.workload_id::text, a.host_id::text, array_agg(a.gpu_id ORDER BY a.gpu_id), max(a.milli), max(a.vcpus),
       max(a.memory_mib), w.tenant_id::text, w.priority, w.billing, w.kind,
       EXTRACT(EPOCH FROM w.started_at)::float8, EXTRACT(EPOCH FROM min(a.created_at))::float8, w.timeout_s,
       EXTRACT(EPOCH FROM w.stop_by)::float8, w.preempted_for::text, m.code, w.pinned_host_id IS NOT NULL,
       w.checkpoint_grace_s, w.attained_gpu_s
FROM {allocation} a
JOIN {host} h ON h.id = a.host_id
JOIN {workload} w ON w.id = a.workload_id
JOIN {itype} t ON t.id = w.instance_type_id
JOIN {model} m ON m.id = t.gpu_model_id
WHERE a.active AND h.region_id = %s
GROUP BY a.workload_id, a.host_id, w.id, m.code
ORDER BY a.workload_id, a.host_id
"""


def _allocation_rows(region_id: int):
    """One row per workload × host, its GPUs as a list.

    On PostgreSQL the GPUs are gathered by `array_agg`, so Python handles one row per
    host a workload holds rather than one per GPU (a quarter to an eighth of the rows),
    and ids come as text: the core wants strings, and 50,000 UUID objects built only to
    be turned back into strings cost a tenth of a second per cycle at 100k GPUs.
    """
    if connection.vendor == "postgresql":
        sql = _ALLOCATIONS_SQL.format(
            allocation=Allocation._meta.db_table, host=Host._meta.db_table, workload=Workload._meta.db_table,
            itype=InstanceType._meta.db_table, model=GpuModel._meta.db_table)
        with bulk.pg_cursor() as cur:
            cur.execute(sql, [region_id])
            yield from cur
        return
    for row in _allocation_rows_orm(region_id):
        yield (row[0], row[1], [row[2]], *row[3:])


def _allocation_rows_orm(region_id: int):
    return (
        Allocation.objects.filter(active=True, host__region_id=region_id)
        .annotate(started_s=Epoch("workload__started_at"), created_s=Epoch("created_at"),
                  stop_by_s=Epoch("workload__stop_by"),
                  pinned=ExpressionWrapper(Q(workload__pinned_host__isnull=False), output_field=BooleanField()))
        .values_list("workload_id", "host_id", "gpu_id", "milli", "vcpus", "memory_mib",
                      "workload__tenant_id", "workload__priority", "workload__billing",
                      "workload__kind", "started_s", "created_s",
                      "workload__timeout_s", "stop_by_s", "workload__preempted_for",
                      "workload__instance_type__gpu_model__code", "pinned",
                      "workload__checkpoint_grace_s", "workload__attained_gpu_s")
        .order_by("workload_id", "host_id", "gpu_id")
    )


def _allocations(region_id: int) -> tuple[core.Allocation, ...]:
    grouped: dict[object, dict] = {}
    for (wid, host, gpus, milli, vcpus, mem, tenant, prio, billing, kind, started, placed,
         timeout, stop_by, preempted_for, model, pinned, grace, attained) in _allocation_rows(region_id):
        entry = grouped.get(wid)
        if entry is None:
            # Not started yet (SCHEDULED, STARTING): it holds its GPUs since it was placed, which
            # is also what the core assumed when it placed it, so the next cycle sees the same
            # expected end (and the same backfill reservations) as the cycle that placed it.
            begun = started or placed or 0.0
            entry = grouped[wid] = {
                "tenant": str(tenant), "priority": prio, "billing": billing, "kind": kind,
                "started": begun, "end": begun + timeout if timeout else None,
                "stop_by": stop_by, "for": str(preempted_for) if preempted_for else None,
                "model": model, "hosts": defaultdict(list), "milli": milli, "vcpus": 0, "mem": 0,
                "pinned": bool(pinned), "grace": grace, "attained": attained or 0.0,
            }
        entry["hosts"][str(host)].extend(gpus)
        entry["vcpus"] = max(entry["vcpus"], vcpus)
        entry["mem"] = max(entry["mem"], mem)
    return tuple(
        core.Allocation(
            request_id=str(wid), tenant_id=e["tenant"], gpu_model=e["model"],
            placements=tuple(core.HostPlacement(host_id=h, gpus=tuple(g), milli=e["milli"])
                             for h, g in sorted(e["hosts"].items())),
            priority=e["priority"], billing=e["billing"], kind=e["kind"], started_at=e["started"],
            expected_end=e["end"], restartable=e["kind"] == WorkloadKind.JOB,
            vcpus=e["vcpus"], memory_mib=e["mem"],
            preempting=e["stop_by"] is not None, preempting_for=e["for"], stop_by=e["stop_by"],
            pinned=e["pinned"], checkpointable=e["grace"] is not None,
            grace_s=float(e["grace"] or 0), attained_service=e["attained"],
        )
        for wid, e in grouped.items()
    )


def _queue(region_id: int, code: str):
    rows = (
        Workload.objects.filter(region_id=region_id, state=State.PENDING)
        .annotate(queued_s=Epoch("queued_at"))
        .values_list("id", "tenant_id", "kind", "priority", "billing", "nodes", "queued_s",
                     "timeout_s", "attained_gpu_s", "reason", "queue_position", "instance_type__gpu_count",
                     "instance_type__gpu_share_milli", "instance_type__vcpus",
                     "instance_type__memory_gib", "instance_type__gpu_model__code", "pinned_host_id",
                     "pinned_host__name", "pinned_because", "checkpoint_grace_s", "queue")
    )
    queue, reasons, models = [], {}, {}
    job_queues: dict[str, tuple[str, str]] = {}  # request id -> (tenant id, queue), jobs only
    for (wid, tenant, kind, prio, billing, nodes, queued, timeout, attained, reason, position, count,
         share, vcpus, mem_gib, model, pinned_host, pinned_host_name, pinned_because, grace, qname) in rows:
        rid = str(wid)
        fractional = share < 1000
        queue.append(core.PlacementRequest(
            request_id=rid, tenant_id=str(tenant), gpu_model=model,
            gpus_per_node=0 if fractional else count, gpu_milli=share, nodes=nodes,
            vcpus=vcpus, memory_mib=mem_gib * 1024, region=code, kind=kind,
            priority=prio, billing=billing, submitted_at=float(queued),
            expected_duration=float(timeout) if timeout else None, attained_service=attained,
            restartable=kind == WorkloadKind.JOB, checkpointable=grace is not None,
            pinned_host=str(pinned_host) if pinned_host else None, pinned_host_name=pinned_host_name or "",
            pinned_because=pinned_because,
        ))
        reasons[rid] = (reason, position)
        models[rid] = model
        if kind == WorkloadKind.JOB:
            job_queues[rid] = (str(tenant), qname)
    # A batch pool's jobs run only on its members' hosts (autoscaling answers which queues are pools).
    confined = hooks.queue_confinement(set(job_queues.values()))
    if confined:
        for i, r in enumerate(queue):
            key = job_queues.get(r.request_id)
            if key in confined:
                name, hosts = confined[key]
                queue[i] = replace(r, pool=name, pool_hosts=hosts)
    return tuple(queue), reasons, models


def tenant_views(tenant_ids: set[str]) -> tuple[core.TenantView, ...]:
    """Weights and quota rules, with usage counted across every region (quotas are global)."""
    if not tenant_ids:
        return ()
    # tenant -> {(model, region): (gpu milli, workloads)}
    usage: dict[str, dict[tuple[str, str], list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    # Summed by PostgreSQL: one row per tenant × model × region, not one per running workload.
    for tenant, model, region, milli, n in (
        Workload.objects.filter(tenant_id__in=list(tenant_ids), state__in=HOLDING)
        .values_list("tenant_id", "instance_type__gpu_model__code", "region__code")
        .annotate(milli=Sum(F("instance_type__gpu_count") * F("instance_type__gpu_share_milli") * F("nodes")),
                  n=Count("id"))
        .order_by()
    ):
        cell = usage[str(tenant)][(model, region)]
        cell[0] += milli
        cell[1] += n

    def counted(tenant: str, rule: core.QuotaRule) -> core.QuotaRule:
        """`rule` with the tenant's usage it counts (core.quota decides which work it counts)."""
        cells = [v for (m, r), v in usage.get(tenant, {}).items() if quota_applies(rule, m, r)]
        return replace(rule, used_gpu_milli=sum(v[0] for v in cells), used_instances=sum(v[1] for v in cells))

    rules: dict[str, list[core.QuotaRule]] = defaultdict(list)
    has_wide: set[str] = set()
    for tenant, model, region, max_gpus, max_n in Quota.objects.filter(tenant_id__in=tenant_ids).values_list(
        "tenant_id", "gpu_model__code", "region__code", "max_gpus", "max_instances"
    ):
        t = str(tenant)
        if model is None and region is None:
            has_wide.add(t)
        rules[t].append(counted(t, core.QuotaRule(max_gpus=max_gpus, max_instances=max_n, gpu_model=model,
                                                  region=region)))
    views = []
    # launch_blocked: billing's verdict pushed down (no credit left, or a hard-stop budget
    # spent): pending work of these tenants waits
    rows = Tenant.objects.filter(pk__in=tenant_ids).values_list("id", "plan", "fair_share_weight", "launch_blocked",
                                                                "launch_blocked_reason", "launch_blocked_budget")
    for tenant_id, plan, weight, blocked, why, budget in rows:
        t = str(tenant_id)
        if t not in has_wide:
            default = settings.PLAN_QUOTAS.get(plan, {})
            rules[t].append(counted(t, core.QuotaRule(max_gpus=default.get("max_gpus"),
                                                      max_instances=default.get("max_instances"))))
        views.append(core.TenantView(tenant_id=t, weight=float(weight), quotas=tuple(rules[t]),
                                     budget_exhausted=blocked,
                                     blocker=blockers.billing_blocker(blocked=blocked, code=why, budget=budget)))
    return tuple(views)
