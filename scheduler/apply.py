"""A plan → guarded writes, in one transaction.

The core already made sure one cycle never books a GPU twice. The database is the
second line: every GPU is claimed with a guarded UPDATE (`WHERE whole = false AND
used_milli = 0` for a whole GPU; `used_milli + share <= 1000` for a share) and the
CHECK constraints on `agents_gpu` refuse anything else. A share is also refused on a
GPU carrying another tenant's shares unless the GPU is open to cross-tenant sharing
(its model's `allow_cross_tenant_sharing`): tenant isolation's second line,
checked in the same guarded UPDATE. A placement whose GPUs or
host resources cannot all be claimed is dropped whole (gang semantics hold in
the database too) and its workload stays PENDING for the next cycle.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import connection
from django.db.models import F

from agents.models import Gpu, Host
from gpucloud.catalogue.models import GpuModel
from gpucloud.tenancy.models import Tenant
from scheduler import bulk, core
from scheduler.choices import State
from scheduler.core.quota import quota_applies, quota_fits
from scheduler.models import Allocation, Workload
from scheduler.services import Notice, workloads_notice, workloads_transition
from scheduler.signals import workloads_placed
from scheduler.snapshot import CycleInput, tenant_views

logger = logging.getLogger(__name__)


@dataclass
class ApplyResult:
    placed: int = 0
    conflicts: int = 0  # placements the database refused (another cycle won)
    rejected: int = 0
    preempt_notices: int = 0
    waiting: int = 0


def _update_returning(sql: str, columns: list[str]) -> set[str]:
    """Run a guarded `UPDATE … FROM unnest(…)` with one array parameter per column.

    Returns the keys (first column) that the statement's RETURNING gave back: the rows
    whose guard held. Each array is one literal (`bulk.pg_array`) bound on the server
    (`bulk.pg_cursor`), so the statement costs the same to send for ten rows or ten thousand.
    """
    with bulk.pg_cursor() as cur:
        cur.execute(sql, columns)
        return {str(r[0]) for r in cur.fetchall()}


def _claim_whole(uuids: list[str]) -> set[str]:
    """Book GPUs whole; returns those that were free."""
    if connection.vendor != "postgresql":
        return {u for u in uuids if Gpu.objects.filter(uuid=u, whole=False, used_milli=0, healthy=True)
                .update(whole=True, used_milli=1000)}
    return _update_returning(
        f"UPDATE {Gpu._meta.db_table} AS g SET whole = true, used_milli = 1000 "
        "FROM unnest(%s::text[]) AS v(uuid) "
        "WHERE g.uuid = v.uuid AND NOT g.whole AND g.used_milli = 0 AND g.healthy RETURNING g.uuid",
        [bulk.pg_array(sorted(uuids))],
    )


def _may_share_orm(uuid: str, tenant: str | None) -> bool:
    """SQLite's form of the tenant guard in `_claim_shares` (one GPU)."""
    if Gpu.objects.filter(gpu_model__allow_cross_tenant_sharing=True, uuid=uuid).exists():
        return True
    return tenant is not None and not (
        Allocation.objects.filter(gpu_id=uuid, active=True, milli__lt=core.WHOLE)
        .exclude(workload__tenant_id=tenant).exists()
    )


def _claim_shares(per_gpu: dict[str, int], tenant_of: dict[str, str | None]) -> set[str]:
    """Add fractional shares, GPU by GPU; returns the GPUs where the whole sum fitted.

    Tenant isolation: ``tenant_of[uuid]`` is the one tenant this plan adds shares of to
    the GPU (None: several). A GPU not open to cross-tenant sharing takes them only
    when it carries no other tenant's active shares. The region's cycle lock serialises
    the appliers of a GPU, so the NOT EXISTS reads a settled set of allocations.
    """
    if connection.vendor != "postgresql":
        return {u for u, milli in per_gpu.items()
                if _may_share_orm(u, tenant_of.get(u))
                and Gpu.objects.filter(uuid=u, whole=False, healthy=True, used_milli__lte=1000 - milli)
                .update(used_milli=F("used_milli") + milli)}
    items = sorted(per_gpu.items())
    return _update_returning(
        f"UPDATE {Gpu._meta.db_table} AS g SET used_milli = g.used_milli + v.m "
        f"FROM unnest(%s::text[], %s::int[], %s::uuid[]) AS v(uuid, m, tenant), {GpuModel._meta.db_table} AS gm "
        "WHERE g.uuid = v.uuid AND gm.id = g.gpu_model_id "
        "AND NOT g.whole AND g.healthy AND g.used_milli + v.m <= 1000 "
        "AND (gm.allow_cross_tenant_sharing OR (v.tenant IS NOT NULL AND NOT EXISTS ("
        f"SELECT 1 FROM {Allocation._meta.db_table} a JOIN {Workload._meta.db_table} w ON w.id = a.workload_id "
        "WHERE a.gpu_id = g.uuid AND a.active AND a.milli < 1000 AND w.tenant_id <> v.tenant))) "
        "RETURNING g.uuid",
        [bulk.pg_array(u for u, _ in items), bulk.pg_array(m for _, m in items),
         bulk.pg_array(tenant_of.get(u) for u, _ in items)],
    )


def _claim_hosts(need: dict[str, list[int]]) -> set[str]:
    """Book vCPUs and memory per host; returns the hosts that had room."""
    if connection.vendor != "postgresql":
        return {h for h, (vc, mem) in need.items()
                if Host.objects.filter(pk=h, used_vcpus__lte=F("vcpus") - vc,
                                       used_memory_mib__lte=F("memory_mib") - mem)
                .update(used_vcpus=F("used_vcpus") + vc, used_memory_mib=F("used_memory_mib") + mem)}
    items = sorted(need.items())
    return _update_returning(
        f"UPDATE {Host._meta.db_table} AS h SET used_vcpus = h.used_vcpus + v.vc, "
        "used_memory_mib = h.used_memory_mib + v.mem FROM unnest(%s::uuid[], %s::int[], %s::bigint[]) "
        "AS v(id, vc, mem) WHERE h.id = v.id AND h.used_vcpus + v.vc <= h.vcpus "
        "AND h.used_memory_mib + v.mem <= h.memory_mib RETURNING h.id",
        [bulk.pg_array(h for h, _ in items), bulk.pg_array(vc for _, (vc, _m) in items),
         bulk.pg_array(mem for _, (_v, mem) in items)],
    )


def _unclaim(whole: list[str], shares: dict[str, int]) -> None:
    if whole:
        Gpu.objects.filter(uuid__in=whole).update(whole=False, used_milli=0)
    for uuid, milli in shares.items():
        Gpu.objects.filter(uuid=uuid).update(used_milli=F("used_milli") - milli)


def apply(*, plan: core.Plan, cycle: CycleInput, now: datetime) -> ApplyResult:
    """Write the plan. Call inside atomic() while holding the region's cycle lock."""
    result = ApplyResult()
    requests = {r.request_id: r for r in cycle.queue}
    places = [d for d in plan.decisions if isinstance(d, core.Place) and d.request_id in requests]
    _apply_places(places, requests, now, result)
    _apply_waits(plan, cycle, result)
    rejects = {UUID(d.request_id): d.reason for d in plan.decisions if isinstance(d, core.Reject)}
    if rejects:
        moved = workloads_transition(ids=rejects, old=State.PENDING, to=State.FAILED, now=now,
                                     reason="rejected", reasons=rejects)
        result.rejected = len(moved)
    notices = [Notice(workload_id=d.victim_id, notice_s=d.notice_s, cause=d.reason,
                      preempted_for=d.because_request_id)
               for d in plan.decisions if isinstance(d, core.Preempt)]
    result.preempt_notices += len(workloads_notice(notices=notices, now=now))
    return result


def _apply_places(places: list[core.Place], requests: dict[str, core.PlacementRequest],
                  now: datetime, result: ApplyResult) -> None:
    if not places:
        return
    # 1. the workloads: only those still PENDING (a user may have stopped one meanwhile)
    pending = _lock_pending(sorted(p.request_id for p in places))
    places = [p for p in places if p.request_id in pending]
    places = _within_quota(places, requests, result)
    # 2. host vCPUs and memory, then the GPUs: guarded updates
    host_need: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in places:
        req = requests[p.request_id]
        for hp in p.placements:
            host_need[hp.host_id][0] += req.vcpus
            host_need[hp.host_id][1] += req.memory_mib
    hosts_ok = _claim_hosts(host_need)
    whole_wanted = [g for p in places for hp in p.placements if hp.milli == core.WHOLE for g in hp.gpus]
    whole_got = _claim_whole(whole_wanted)
    share_wanted: dict[str, int] = defaultdict(int)
    share_tenant: dict[str, str | None] = {}  # the one tenant whose shares go on it; None: several
    for p in places:
        tenant = requests[p.request_id].tenant_id
        for hp in p.placements:
            if hp.milli != core.WHOLE:
                for g in hp.gpus:
                    share_wanted[g] += hp.milli
                    share_tenant[g] = tenant if share_tenant.get(g, tenant) == tenant else None
    shares_got = _claim_shares(dict(share_wanted), share_tenant) if share_wanted else set()
    accepted: list[core.Place] = []
    drop_hosts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    give_back_whole: list[str] = []
    give_back_shares: dict[str, int] = defaultdict(int)
    for p in places:
        req = requests[p.request_id]
        ok = all(
            hp.host_id in hosts_ok
            and all(g in (whole_got if hp.milli == core.WHOLE else shares_got) for g in hp.gpus)
            for hp in p.placements
        )
        if ok:
            accepted.append(p)
            continue
        # all or nothing: give back what this placement got
        result.conflicts += 1
        for hp in p.placements:
            for g in hp.gpus:
                if hp.milli == core.WHOLE and g in whole_got:
                    give_back_whole.append(g)
                elif hp.milli != core.WHOLE and g in shares_got:
                    give_back_shares[g] += hp.milli
            if hp.host_id in hosts_ok:
                drop_hosts[hp.host_id][0] += req.vcpus
                drop_hosts[hp.host_id][1] += req.memory_mib
    _unclaim(give_back_whole, give_back_shares)
    for host, (vcpus, mem) in drop_hosts.items():
        Host.objects.filter(pk=host).update(used_vcpus=F("used_vcpus") - vcpus,
                                            used_memory_mib=F("used_memory_mib") - mem)
    if not accepted:
        return
    # 3. allocation rows, then the state change with its events
    rows: list[tuple] = []
    for p in accepted:
        req = requests[p.request_id]
        for hp in p.placements:
            for i, g in enumerate(hp.gpus):
                # (gpu, host, workload, milli, vcpus, memory): the host's CPU and memory
                # booking rides on its first GPU row
                rows.append((g, hp.host_id, p.request_id, hp.milli,
                             req.vcpus if i == 0 else 0, req.memory_mib if i == 0 else 0))
    bulk.insert_allocations(rows, now=now)
    moved = workloads_transition(ids=[UUID(p.request_id) for p in accepted], old=State.PENDING,
                                 to=State.SCHEDULED, reason="placed; waiting for the host agent to start it",
                                 now=now)
    assert len(moved) == len(accepted), "workloads were locked above"
    result.placed = len(accepted)
    workloads_placed.send(sender=Workload, hosts={p.request_id: p.placements[0].host_id for p in accepted})


def _lock_pending(ids: list[str]) -> set[str]:
    """Lock the workloads that are still PENDING, skipping rows another transaction holds."""
    if connection.vendor != "postgresql":
        return set(str(pk) for pk in Workload.objects.select_for_update(skip_locked=True)
                   .filter(pk__in=ids, state=State.PENDING).values_list("pk", flat=True))
    with bulk.pg_cursor() as cur:
        cur.execute(f"SELECT id FROM {Workload._meta.db_table} WHERE id = ANY(%s::uuid[]) AND state = %s "
                    "ORDER BY id FOR UPDATE SKIP LOCKED", [bulk.pg_array(ids), State.PENDING.value])
        return {str(r[0]) for r in cur.fetchall()}


def _within_quota(places: list[core.Place], requests: dict[str, core.PlacementRequest],
                  result: ApplyResult) -> list[core.Place]:
    """Re-check quotas against the database under the tenants' row locks.

    The region lock serialises cycles of one region, but quotas span regions: two
    regions' cycles could each admit up to a tenant-wide limit. Locking the tenant
    rows (in id order, so cycles cannot deadlock) and counting committed usage makes
    the limit hold whatever runs at once (invariant 2).
    """
    tenant_ids = sorted({requests[p.request_id].tenant_id for p in places})
    if not tenant_ids:
        return places
    list(Tenant.objects.select_for_update().filter(pk__in=tenant_ids).order_by("pk").values_list("pk"))
    rules = {t.tenant_id: [[q, q.used_gpu_milli or 0, q.used_instances or 0] for q in t.quotas]
             for t in tenant_views(set(tenant_ids))}
    kept = []
    for p in places:
        req = requests[p.request_id]
        applying = [r for r in rules.get(req.tenant_id, ()) if quota_applies(r[0], req.gpu_model, req.region)]
        fits = all(quota_fits(q, used, n, req.total_milli) for q, used, n in applying)
        if not fits:
            result.conflicts += 1
            continue
        for r in applying:
            r[1] += req.total_milli
            r[2] += 1
        kept.append(p)
    return kept


def _apply_waits(plan: core.Plan, cycle: CycleInput, result: ApplyResult) -> None:
    """Reasons and queue positions; only rows whose text or position changed are written."""
    position: dict[str, int] = defaultdict(int)
    changed: dict[str, tuple[str, int]] = {}
    for d in plan.decisions:
        if not isinstance(d, core.Wait):
            continue
        result.waiting += 1
        model = cycle.gpu_model_of.get(d.request_id, "")
        position[model] += 1
        new = (d.reason[:500], position[model])
        if cycle.shown.get(d.request_id) != new:
            changed[d.request_id] = new
    bulk.set_wait_reasons(changed)
