"""Writes for workloads: launch, the one transition function, stop, delete, requeue.

Only `workload_transition` / `workloads_transition` write `Workload.state`. Every
transition is a guarded UPDATE (`WHERE state = old`): zero rows means another
actor won the race, which is not an error. Leaving a GPU-holding state releases
the workload's allocations in the same transaction.
"""
from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Subquery
from django.utils import timezone

from agents.choices import HostState
from agents.models import Gpu, Host
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region
from gpucloud.lib.db import model_columns, model_from_row, pg_array, pg_cursor
from gpucloud.lib.errors import Conflict, InvalidInput, NotFoundError
from gpucloud.tenancy.audit import audit_record, current_actor
from gpucloud.tenancy.models import Tenant
from scheduler import bulk, hooks
from scheduler.admission import launch_admit
from scheduler.choices import HOLDING, TERMINAL, Billing, State, WorkloadKind
from scheduler.lifecycle import can_transition
from scheduler.models import Allocation, ContainerEvent, Workload, WorkloadEvent
from scheduler.notice import notice_served
from scheduler.signals import workload_launching, workload_starting

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """What a user asks for. Validated for shape by the API; for meaning here."""

    kind: str
    name: str
    instance_type: str
    region: str
    image: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    ssh_keys: list[str] = field(default_factory=list)
    billing: str = Billing.ON_DEMAND
    priority: str = "standard"
    queue: str = "default"
    nodes: int = 1
    max_retries: int = 0
    timeout_s: int | None = None
    max_price: Decimal | None = None  # spot only: preempted when the spot price passes it
    auto_stop_idle_minutes: int | None = None  # instances only: stop after this long with idle GPUs
    # [{"volume": id, "mount_path": "/workspace"}]: attached by the volumes app (workload_launching)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    # jobs only: {"signal": "SIGUSR1", "grace_s": 60}, sent before a preemption stops it
    checkpoint: dict[str, Any] | None = None

    def checkpoint_fields(self) -> dict[str, Any]:
        """The Workload columns of ``checkpoint``."""
        cp = self.checkpoint
        if not cp:
            return {"checkpoint_signal": "", "checkpoint_grace_s": None}
        return {"checkpoint_signal": cp["signal"], "checkpoint_grace_s": cp["grace_s"]}


def _resolve(spec: WorkloadSpec) -> tuple[InstanceType, Region]:
    """The active instance type and region named in `spec`, offered there at `spec.billing`
    (their price now is kept on the type as `price_now`, for the launch's answer).

    One query when all is well (the price in force, joined to both); the precise refusals
    below only when it finds nothing."""
    with connection.cursor() as cur:  # the ORM's query cost more CPU to build than to run
        # parameters as the ORM would send them (SQLite, the demo's database, takes neither an aware
        # datetime's offset nor a UUID as they are)
        cur.execute(_resolve_sql(), [spec.instance_type, spec.region, spec.billing,
                                     connection.ops.adapt_datetimefield_value(timezone.now())])
        row = cur.fetchone()
    if row is not None:
        price, at = model_from_row(Price, row)
        it, at = model_from_row(InstanceType, row, at)
        it.gpu_model, at = model_from_row(GpuModel, row, at)
        region, _ = model_from_row(Region, row, at)
        it.price_now = price.per_hour
    else:
        it, region = _resolve_refusal(spec)
    if it.gpu_share_milli < 1000 and spec.nodes > 1:
        raise InvalidInput("A fractional GPU type runs on one node.", fields={"nodes": ["Must be 1."]})
    return it, region


@functools.cache
def _resolve_sql() -> str:
    """The price in force of a type (with its GPU model) in a region at a billing kind,
    both active; the newest first. As the ORM would write it, once."""
    p, it, gm, r = (m._meta.db_table for m in (Price, InstanceType, GpuModel, Region))
    return (f'SELECT {model_columns(Price, "p")}, {model_columns(InstanceType, "it")}, '
            f'{model_columns(GpuModel, "gm")}, {model_columns(Region, "r")} '
            f'FROM "{p}" p JOIN "{it}" it ON it."id" = p."instance_type_id" '
            f'JOIN "{gm}" gm ON gm."id" = it."gpu_model_id" JOIN "{r}" r ON r."id" = p."region_id" '
            f'WHERE it."code" = %s AND it."active" AND r."code" = %s AND r."active" AND p."kind" = %s '
            f'AND p."effective_from" <= %s ORDER BY p."effective_from" DESC LIMIT 1')


def _resolve_refusal(spec: WorkloadSpec) -> tuple[InstanceType, Region]:
    it = InstanceType.objects.select_related("gpu_model").filter(code=spec.instance_type, active=True).first()
    if it is None:
        raise InvalidInput(f"Unknown instance type {spec.instance_type!r}.",
                           code="unknown_instance_type",
                           fields={"instance_type": [f"No instance type {spec.instance_type!r}."]})
    region = Region.objects.filter(code=spec.region, active=True).first()
    if region is None:
        raise InvalidInput(f"Unknown region {spec.region!r}.", code="unknown_region",
                           fields={"region": [f"No region {spec.region!r}."]})
    raise InvalidInput(
        f"{it.code} is not offered {spec.billing.replace('_', '-')} in {region.code}.",
        code="not_offered",
        fields={"instance_type": [f"Not offered in {region.code} as {spec.billing}."]},
    )


def _record(workload: Workload, old: str, new: str, reason: str, now: datetime) -> WorkloadEvent:
    return WorkloadEvent(workload_id=workload.pk if isinstance(workload, Workload) else workload,
                         from_state=old, to_state=new, reason=reason[:500],
                         actor=current_actor().label[:200], created_at=now)


def _check_max_price(it: InstanceType, region: Region, spec: WorkloadSpec, now: datetime) -> None:
    """Refuse a spot max price below the spot price in force."""
    if spec.max_price is not None and spec.billing == Billing.SPOT:
        current = (Price.objects.filter(instance_type=it, region=region, kind=Billing.SPOT, effective_from__lte=now)
                   .order_by("-effective_from").values_list("per_hour", flat=True).first())
        if current is not None and current > spec.max_price:
            raise InvalidInput(
                f"The spot price of {it.code} in {region.code} is {current}/h, above your max "
                f"price {spec.max_price}/h.", code="max_price_below_spot",
                fields={"max_price": [f"Below the current spot price {current}."]},
            )


def _admit(tenant: Tenant, it: InstanceType, region: Region, spec: WorkloadSpec,
           tenant_fresh: bool = False) -> str:
    """The spot max price (the request's own mistake first), then the launch's admission
    (scheduler.admission: quota, billing, a fleet that could ever run it; refused with the
    cause's 4xx). Returns the new workload's first waiting reason."""
    _check_max_price(it, region, spec, timezone.now())
    waits = launch_admit(tenant=tenant, instance_type=it, region=region, nodes=spec.nodes, tenant_fresh=tenant_fresh)
    return waits or "waiting for the scheduler"


@transaction.atomic
def workload_launch(*, tenant: Tenant, spec: WorkloadSpec, user=None, tenant_fresh: bool = False) -> Workload:
    """Queue an instance or a batch job. It waits PENDING until the scheduler places it.

    `tenant_fresh`: `tenant` was read in this request (see `scheduler.admission`)."""
    it, region = _resolve(spec)
    reason = _admit(tenant, it, region, spec, tenant_fresh=tenant_fresh)  # 4xx: refused, with the cause
    now = timezone.now()
    workload = Workload.objects.create(
        tenant=tenant, kind=spec.kind, name=spec.name, instance_type=it, region=region,
        image=spec.image, command=spec.command, env=spec.env, ports=spec.ports, ssh_keys=spec.ssh_keys,
        billing=spec.billing, priority=spec.priority, queue=spec.queue, nodes=spec.nodes,
        max_retries=spec.max_retries, timeout_s=spec.timeout_s, max_price=spec.max_price, state=State.PENDING,
        auto_stop_idle_minutes=spec.auto_stop_idle_minutes, **spec.checkpoint_fields(),
        reason=reason, created_by=user, created_at=now, queued_at=now,
    )
    event = _record(workload, "", State.PENDING, "submitted", now)
    event.save()
    workload.launch_event = event  # the 201 answer is built from these, without reading them back
    workload.launch_price = getattr(it, "price_now", None)
    if spec.volumes:
        got = workload_launching.send(sender=Workload, workload=workload, spec=spec)
        if not got:  # nobody attached them: refuse rather than run without the renter's data
            raise InvalidInput("Volumes are not available here.", code="invalid",
                               fields={"volumes": ["Volumes are not available."]})
    audit_record(tenant=tenant, action=f"{spec.kind}.launch", obj=workload, object_repr=spec.name,
                 data={"instance_type": it.code, "region": region.code, "billing": spec.billing,
                       "priority": spec.priority})
    hooks.cycle_wanted(region.pk)
    return workload


# ---------------------------------------------------------------- transitions


def _timestamps(new: str, now: datetime) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if new == State.RUNNING:
        values["started_at"] = now
    if new in TERMINAL:
        values["ended_at"] = now
    if new == State.PENDING:
        # back in the queue: age counts from now, the notice is gone
        values.update(queued_at=now, stop_by=None, stop_cause="", preempted_for=None, started_at=None,
                      ended_at=None)
    else:
        values["queue_position"] = None  # only queued work stands in the queue
    return values


@transaction.atomic
def workload_transition(*, workload: Workload, to: str, reason: str = "",
                        now: datetime | None = None, **extra: Any) -> bool:
    """Move `workload` to `to` if it is still in the state we loaded. Returns whether it moved.

    Records the event, releases GPUs when leaving a holding state, and asks for a
    scheduling cycle when GPUs were freed or work was queued.
    """
    old = workload.state
    if not can_transition(old, to):
        raise Conflict(f"A {workload.kind} cannot go from {old} to {to}.", code="illegal_transition")
    now = now or timezone.now()
    values = {"state": to, "reason": reason[:500], **_timestamps(to, now), **extra}
    if Workload.objects.filter(pk=workload.pk, state=old).update(**values) == 0:
        return False  # somebody else moved it first
    for key, value in values.items():
        setattr(workload, key, value)
    _record(workload, old, to, reason, now).save()
    if old in HOLDING or to in HOLDING:
        hooks.holding_changed([workload.pk])  # their hosts' heartbeat answers
    if old in HOLDING and to not in HOLDING:
        release_allocations(workload_ids=[workload.pk], now=now)
    if to == State.PENDING or (old in HOLDING and to not in HOLDING):
        hooks.cycle_wanted(workload.region_id)
    return True


def workloads_transition(*, ids: Iterable[UUID], old: str, to: str, reason: str = "",
                         now: datetime | None = None, reasons: dict[UUID, str] | None = None,
                         facts: dict[str, Any] | None = None,
                         hosts: Iterable[UUID | str] | None = None) -> list[UUID]:
    """The bulk form of `workload_transition` for the scheduling cycle: one UPDATE, one INSERT.

    Call inside atomic() (a move may go without where it is one statement,
    `bulk.state_with_events_is_one_statement`: between holding states, or one that frees the
    GPUs when `hosts` is given). Returns the ids that moved (those still in `old`). `facts`:
    other fields the same UPDATE sets on them (a reported exit code), as `workload_transition`'s.
    `hosts`: the hosts where they hold allocations, when the caller knows (a heartbeat's own
    host for its single-host work), saving the fast path's query for them; on PostgreSQL a
    move that frees their GPUs is then one statement with the release (`_moved_and_released_pg`).
    """
    if not can_transition(old, to):
        raise Conflict(f"Cannot go from {old} to {to}.", code="illegal_transition")
    now = now or timezone.now()
    ids = list(ids)
    values: dict[str, Any] = {"state": to, "reason": reason[:500], **_timestamps(to, now), **(facts or {})}
    if to in HOLDING:
        values["queue_position"] = None
    actor = current_actor().label[:200]
    why = reason[:500]
    frees = old in HOLDING and to not in HOLDING
    if reasons:
        moved = bulk.set_state(ids, old=old, values=values)
        for pk in moved:
            if reasons.get(pk):
                Workload.objects.filter(pk=pk).update(reason=reasons[pk][:500])
        bulk.insert_events([(pk, old, to, (reasons.get(pk) or why)[:500], actor, now) for pk in moved])
    elif frees and hosts is not None and bulk.state_with_events_is_one_statement(len(ids)):
        moved = _moved_and_released_pg(ids, values=values, old=old, reason=why, actor=actor, now=now)
        hooks.holding_changed(moved, hosts)  # (hosts known: no read of the released allocations)
        return moved
    else:
        moved = bulk.set_state_with_events(ids, old=old, values=values, reason=why, actor=actor, now=now)
    if old in HOLDING or to in HOLDING:
        hooks.holding_changed(moved, hosts)  # their hosts' heartbeat answers
    if frees:
        release_allocations(workload_ids=moved, now=now)
    return moved


@dataclass(frozen=True)
class Notice:
    """Notice for one workload (scheduler/notice.py): it stops `notice_s` from now because of
    `cause` (no countdown in it); `preempted_for`: the request it makes room for, if any."""

    workload_id: UUID | str
    notice_s: float
    cause: str
    preempted_for: str | None = None


# Work under notice holds GPUs and is not being stopped already.
_NOTICEABLE = (State.SCHEDULED, State.STARTING, State.RUNNING)


def workloads_notice(*, notices: Iterable[Notice], now: datetime) -> list[str]:
    """Give notice: the one way the scheduler, billing (spot) and agents (drain) do. Returns
    the ids given notice now.

    A notice lasts at least the workload's checkpoint grace (time to save its progress). Only
    work that holds GPUs and is not on notice yet gets one: a guarded update per workload, so
    one already on notice keeps its earlier deadline and cause. Their hosts' answers carry
    the notice (a checkpointing job gets its signal); the cycle ends it as PREEMPTED when it
    runs out (scheduler.cycle).
    """
    notices = list(notices)
    if not notices:
        return []
    grace = dict(Workload.objects.filter(pk__in=[n.workload_id for n in notices])
                 .values_list("pk", "checkpoint_grace_s"))
    noticed = []
    for n in notices:
        seconds = max(n.notice_s, grace.get(UUID(str(n.workload_id))) or 0)
        if Workload.objects.filter(pk=n.workload_id, stop_by__isnull=True, state__in=_NOTICEABLE).update(
                stop_by=now + timedelta(seconds=seconds), stop_cause=n.cause[:500],
                preempted_for=n.preempted_for):
            noticed.append(str(n.workload_id))
    if noticed:
        hooks.holding_changed(noticed)
    return noticed


def release_allocations(*, workload_ids: Iterable[UUID], now: datetime | None = None) -> int:
    """Free the GPUs, vCPUs and memory the workloads hold. Call inside atomic(). Idempotent."""
    now = now or timezone.now()
    if connection.vendor == "postgresql":
        return _release_allocations_pg(list(workload_ids), now)
    rows = list(
        Allocation.objects.select_for_update().filter(workload_id__in=list(workload_ids), active=True)
        .values("id", "gpu_id", "host_id", "milli", "vcpus", "memory_mib")
    )
    if not rows:
        return 0
    per_gpu: dict[str, int] = defaultdict(int)
    per_host: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        per_gpu[r["gpu_id"]] += r["milli"]
        per_host[r["host_id"]][0] += r["vcpus"]
        per_host[r["host_id"]][1] += r["memory_mib"]
    Allocation.objects.filter(pk__in=[r["id"] for r in rows]).update(active=False, released_at=now)
    # hosts before GPUs: the order the heartbeat and the applier lock them in
    for host, (vcpus, mem) in sorted(per_host.items(), key=lambda kv: str(kv[0])):
        if vcpus or mem:
            Host.objects.filter(pk=host).update(used_vcpus=F("used_vcpus") - vcpus,
                                                used_memory_mib=F("used_memory_mib") - mem)
    whole = [g for g, m in per_gpu.items() if m == 1000]
    if whole:
        # a GPU held at 1000 milli is either whole or full of shares; both leave it empty
        Gpu.objects.filter(uuid__in=whole).update(whole=False, used_milli=0)
    for gpu, milli in per_gpu.items():
        if milli != 1000:
            Gpu.objects.filter(uuid=gpu).update(used_milli=F("used_milli") - milli)
    return len(rows)


# What a release takes off a host (`v.vcpus`, `v.mem`) and a GPU (`v.milli`): a GPU held at
# 1000 milli is either whole or full of shares; both leave it empty.
_HOST_FREED = "used_vcpus = h.used_vcpus - v.vcpus, used_memory_mib = h.used_memory_mib - v.mem"
_GPU_FREED = ("whole = CASE WHEN v.milli = 1000 THEN false ELSE g.whole END, "
              "used_milli = CASE WHEN v.milli = 1000 THEN 0 ELSE g.used_milli - v.milli END")


def _release_allocations_pg(workload_ids: list[UUID], now: datetime) -> int:
    """`release_allocations` in three written statements: the allocations' UPDATE … RETURNING
    (it locks them as the ORM's `select_for_update` did), the GPUs' and the hosts' counters
    each in one `UPDATE … FROM unnest`. Every heartbeat that ends work releases; the ORM's
    read, its UPDATE and one UPDATE per GPU and host cost more CPU than PostgreSQL took."""
    with pg_cursor() as cur:
        cur.execute(
            f"UPDATE {Allocation._meta.db_table} SET active = false, released_at = %s "
            "WHERE workload_id = ANY(%s::uuid[]) AND active RETURNING gpu_id, host_id, milli, vcpus, memory_mib",
            [now, pg_array(workload_ids)],
        )
        rows = cur.fetchall()
        if not rows:
            return 0
        per_gpu: dict[str, int] = defaultdict(int)
        per_host: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
        for gpu, host, milli, vcpus, mem in rows:
            per_gpu[gpu] += milli
            per_host[host][0] += vcpus
            per_host[host][1] += mem
        # hosts before GPUs: the heartbeat locks its host first and the applier claims hosts
        # before GPUs; taking the GPUs first deadlocked with a heartbeat of the same host
        hosts = sorted((h for h, (v, m) in per_host.items() if v or m), key=str)
        # (every array as one literal, `pg_array`: psycopg's list dumpers cost more CPU than
        # the statement; a heartbeat's release is one host and a few GPUs)
        if hosts:
            cur.execute(
                f"UPDATE {Host._meta.db_table} AS h SET {_HOST_FREED} "
                "FROM unnest(%s::uuid[], %s::int8[], %s::int8[]) AS v(id, vcpus, mem) WHERE h.id = v.id",
                [pg_array(hosts), pg_array(per_host[h][0] for h in hosts), pg_array(per_host[h][1] for h in hosts)],
            )
        gpus = sorted(per_gpu)
        cur.execute(
            f"UPDATE {Gpu._meta.db_table} AS g SET {_GPU_FREED} "
            "FROM unnest(%s::text[], %s::int[]) AS v(uuid, milli) WHERE g.uuid = v.uuid",
            [pg_array(gpus), pg_array(per_gpu[g] for g in gpus)],
        )
    return len(rows)


def _moved_and_released_pg(ids: list[UUID], *, values: dict[str, Any], old: str, reason: str, actor: str,
                           now: datetime) -> list[UUID]:
    """`bulk.set_state_with_events` and `_release_allocations_pg` of the workloads that moved, as
    one statement (a transaction of its own outside atomic()): a heartbeat that ends work on its
    host paid a round trip for each of the five (BEGIN, the move, the allocations, the host, the
    GPUs) and one for COMMIT. Returns the ids that moved.

    Each step reads the one before it whole (an array or an aggregate of its RETURNING), and the
    GPUs' step has a one-time filter on the host's, so it waits for it: rows are locked in
    `_release_allocations_pg`'s order, workloads, allocations, host, then GPUs."""
    moved, params = bulk.moved_with_events_ctes(ids, old=old, values=values, reason=reason, actor=actor, now=now)
    with pg_cursor() as cur:
        cur.execute(
            f"WITH {moved}, "
            f"rel AS (UPDATE {Allocation._meta.db_table} SET active = false, released_at = %s "
            "WHERE workload_id = ANY(ARRAY(SELECT workload_id FROM ev)) AND active "
            "RETURNING gpu_id, host_id, milli, vcpus, memory_mib), "
            f"h AS (UPDATE {Host._meta.db_table} AS h SET {_HOST_FREED} "
            "FROM (SELECT host_id, SUM(vcpus)::int8 AS vcpus, SUM(memory_mib)::int8 AS mem FROM rel "
            "GROUP BY host_id) AS v WHERE h.id = v.host_id AND (v.vcpus <> 0 OR v.mem <> 0) RETURNING h.id), "
            f"g AS (UPDATE {Gpu._meta.db_table} AS g SET {_GPU_FREED} "
            "FROM (SELECT gpu_id, SUM(milli)::int AS milli FROM rel GROUP BY gpu_id) AS v "
            "WHERE g.uuid = v.gpu_id AND (SELECT COUNT(*) FROM h) >= 0 RETURNING g.uuid) "
            "SELECT (SELECT COUNT(*) FROM g), ARRAY(SELECT workload_id FROM ev)",
            [*params, now],
        )
        return list(cur.fetchall()[0][1])


# ---------------------------------------------------------------- user actions


@transaction.atomic
def workload_stop(*, workload: Workload, reason: str = "stopped by user") -> Workload:
    """Stop a workload. Idempotent: stopping a stopped workload changes nothing.

    Work that never started on a host stops at once; started work goes STOPPING
    until its agent reports the container gone. A workload deleted meanwhile (a DELETE that
    took the row lock first) is gone for its tenant: NotFoundError, as a later request gets.
    """
    workload = Workload.objects.select_for_update().get(pk=workload.pk)
    if workload.state in TERMINAL or workload.state == State.STOPPING:
        if workload.deleted_at is not None:
            raise NotFoundError(f"No such {workload.kind}.")
        return workload
    if workload.state in (State.PENDING, State.SCHEDULED):
        target = State.STOPPED
    else:
        target = State.STOPPING
    workload_transition(workload=workload, to=target, reason=reason)
    audit_record(tenant=workload.tenant, action=f"{workload.kind}.stop", obj=workload,
                 object_repr=workload.name)
    return workload


@transaction.atomic
def workload_start(*, workload: Workload) -> Workload:
    """Start a stopped instance again: back through the queue with the same configuration.

    Refused as a launch would be (the type no longer offered there, no host that could ever
    run it, quota, credit); `409 not_stopped` unless it is STOPPED. Under the row lock, so a
    racing stop, start or delete takes turns with it.
    """
    workload = Workload.objects.select_for_update().get(pk=workload.pk)
    if workload.deleted_at is not None:
        raise NotFoundError(f"No such {workload.kind}.")
    if workload.kind != WorkloadKind.INSTANCE:
        raise Conflict("Only an instance starts again; submit a new job instead.", code="not_stopped")
    if workload.state != State.STOPPED:
        raise Conflict(f"Only a stopped instance can start; {workload.name} is {workload.state}.",
                       code="not_stopped")
    spec = WorkloadSpec(kind=workload.kind, name=workload.name, instance_type=workload.instance_type.code,
                        region=workload.region.code, image=workload.image, billing=workload.billing,
                        nodes=workload.nodes, max_price=workload.max_price)
    it, region = _resolve(spec)
    waits = _admit(workload.tenant, it, region, spec)
    # its volumes must be free again (a receiver refuses with 409 when another workload holds one)
    workload_starting.send(sender=Workload, workload=workload)
    workload_transition(workload=workload, to=State.PENDING, reason=f"started again by its owner; {waits}")
    audit_record(tenant=workload.tenant, action=f"{workload.kind}.start", obj=workload,
                 object_repr=workload.name)
    return workload


TIMEOUT_PREFIX = "timeout:"


def workload_stopped(*, workload: Workload, reason: str, **extra: Any) -> bool:
    """The container of a STOPPING workload is gone: end it as what the stop was for.

    A job stopped for running past `timeout_s` ends FAILED (keeping the timeout
    reason); anything else stopped on request ends STOPPED.
    """
    if workload.reason.startswith(TIMEOUT_PREFIX):
        return workload_transition(workload=workload, to=State.FAILED, reason=workload.reason, **extra)
    return workload_transition(workload=workload, to=State.STOPPED, reason=reason, **extra)


@transaction.atomic
def workload_delete(*, workload: Workload) -> None:
    """Terminate: stop it if it runs, and hide it from the tenant's lists. Billing keeps the row.

    Under the row lock, so concurrent DELETEs (and a racing stop) take turns: the first
    deletes and records the one audit event, the others find it gone (NotFoundError).
    """
    workload = Workload.objects.select_for_update().get(pk=workload.pk)
    if workload.deleted_at is not None:
        raise NotFoundError(f"No such {workload.kind}.")
    workload_stop(workload=workload, reason="terminated by user")
    Workload.objects.filter(pk=workload.pk).update(deleted_at=timezone.now())
    audit_record(tenant=workload.tenant, action=f"{workload.kind}.delete", obj=workload,
                 object_repr=workload.name)


def workload_notice_served(*, workload: Workload) -> Workload:
    """Its preemption notice ran out, or it ended under it: PREEMPTED with the notice's cause
    (scheduler/notice.py); a job goes back to the queue without spending a retry."""
    return workload_requeue_or_end(workload=workload, ended=State.PREEMPTED, reason=notice_served(workload.stop_cause))


@transaction.atomic
def workload_requeue_or_end(*, workload: Workload, ended: str, reason: str) -> Workload:
    """A run ended as `ended` (FAILED, PREEMPTED, LOST). Requeue a batch job that may retry.

    Preemption and host loss do not spend a job's retries (it was not the job's
    fault); a failure does. Instances stay ended: a rental restarted elsewhere would
    surprise its owner. A job's run adds to its attained service (GPU-seconds), which it
    keeps in the queue (least-attained-service order, time-slicing; a checkpointing job
    resumes with it).
    """
    now = timezone.now()
    extra: dict[str, Any] = {}
    if workload.kind == WorkloadKind.JOB and workload.started_at is not None:
        it = workload.instance_type
        ran = max(0.0, (now - workload.started_at).total_seconds())
        extra["attained_gpu_s"] = workload.attained_gpu_s + it.gpu_count * it.gpu_share_milli / 1000 \
            * workload.nodes * ran
    if not workload_transition(workload=workload, to=ended, reason=reason, now=now, **extra):
        return workload
    if workload.kind != WorkloadKind.JOB:
        return workload
    if ended == State.FAILED:
        if workload.retries >= workload.max_retries:
            return workload
        Workload.objects.filter(pk=workload.pk).update(retries=F("retries") + 1)
        workload.refresh_from_db()
        again = f"retry {workload.retries} of {workload.max_retries} after: {reason}"
    else:
        again = f"requeued after: {reason}"
    workload_transition(workload=workload, to=State.PENDING, reason=again)
    return workload


# ---------------------------------------------------------------- starting and containers

# What a start that failed and is tried again says meanwhile (scheduler.container's NOTE);
# the bound on time reads the runtime's message back from it.
START_FAILED_MARK = "trying again: "


def workload_note(*, workload: Workload, reason: str) -> bool:
    """Set the reason alone, guarded on the state as loaded (no move, no event): a start that
    failed and is tried again, a container recreated. Whether it was still in that state."""
    reason = reason[:500]
    if Workload.objects.filter(pk=workload.pk, state=workload.state).update(reason=reason) == 0:
        return False
    workload.reason = reason
    return True


def container_event_record(*, workload: Workload, kind: str, count: int, detail: str,
                           now: datetime | None = None) -> ContainerEvent:
    """Record that `workload`'s container was lost or restarted without its agent's order
    (scheduler.container's EVENT step): the timeline, the API, `gpucloud show` and the alarms'
    `container_events` metric read it."""
    event = ContainerEvent.objects.create(workload_id=workload.pk, kind=kind, count=count, detail=detail[:500],
                                          created_at=now or timezone.now())
    logger.warning("%s workload=%s count=%d: %s", kind, workload.pk, count, detail)
    return event


def container_history(*, workload: Workload) -> tuple[int, int]:
    """(container_lost events, highest container_restarted count) of `workload`'s current run
    (since it last started), for the container rule (`scheduler.container.Seen`)."""
    rows = ContainerEvent.objects.filter(workload_id=workload.pk)
    if workload.started_at is not None:
        rows = rows.filter(created_at__gte=workload.started_at)
    losses = restarts = 0
    for kind, count in rows.values_list("kind", "count"):
        if kind == ContainerEvent.Kind.LOST:
            losses += 1
        else:
            restarts = max(restarts, count)
    return losses, restarts


def workloads_start_overdue(*, now: datetime | None = None) -> list[UUID]:
    """The bound on time in SCHEDULED/STARTING: work placed more than WORKLOAD_START_TIMEOUT_S
    ago that is still not running ends FAILED with the runtime's last message (a job is
    requeued if its retries allow), and its GPUs are released (never billed: billing counts
    RUNNING only). Work on a DOWN host is left to the liveness rule (LOST, no retry spent).
    Returns the ids it failed. The bound on attempts is the heartbeat's (scheduler.container)."""
    now = now or timezone.now()
    bound = settings.WORKLOAD_START_TIMEOUT_S
    placed = (WorkloadEvent.objects.filter(workload=OuterRef("pk"), to_state=State.SCHEDULED)
              .order_by("-created_at").values("created_at")[:1])
    down = Allocation.objects.filter(workload=OuterRef("pk"), active=True, host__state=HostState.DOWN)
    overdue = (Workload.objects.filter(state__in=(State.SCHEDULED, State.STARTING))
               .annotate(placed_at=Subquery(placed)).filter(placed_at__lt=now - timedelta(seconds=bound))
               .exclude(Exists(down)).select_related("instance_type"))
    failed = []
    for w in overdue:
        _, mark, message = w.reason.partition(START_FAILED_MARK)
        reason = f"did not start within {bound} s" + (f": {message}" if mark else "")
        before = w.state
        workload_requeue_or_end(workload=w, ended=State.FAILED, reason=reason)
        if w.state != before:
            failed.append(w.pk)
            logger.warning("start overdue workload=%s: %s", w.pk, reason)
    return failed
