"""Writes for volumes: create, resize, delete (soft), attach at launch, pin to a host, purge.

Each write records its audit event in the same transaction. The rule "one writer at a
time" is checked under the volume's row lock: a volume is attached to at most one
workload that is queued or holds GPUs (scheduler.choices.ACTIVE).
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from agents.fastpath import hosts_changed
from gpucloud.catalogue.models import Region
from gpucloud.lib import paths
from gpucloud.lib.errors import Conflict, InvalidInput
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.models import Tenant
from scheduler.choices import ACTIVE
from scheduler.models import Workload
from volumes.models import DOCKER_PREFIX, StoragePrice, Volume, VolumeAttachment, VolumeEvent, VolumeSize
from volumes.selectors import open_move

MAX_SIZE_GIB = 64 * 1024


def quota_gib(tenant: Tenant) -> int:
    """The most GiB of live volumes `tenant` may hold (settings.VOLUME_QUOTA_GIB, by plan)."""
    per_plan: dict[str, int] = settings.VOLUME_QUOTA_GIB
    return int(per_plan.get(tenant.plan, per_plan.get("default", 1024)))


def used_gib(tenant: Tenant, *, exclude: Volume | None = None) -> int:
    qs = Volume.objects.for_tenant(tenant).filter(deleted_at__isnull=True)
    if exclude is not None:
        qs = qs.exclude(pk=exclude.pk)
    return int(qs.aggregate(n=Sum("size_gib"))["n"] or 0)


def _check_quota(tenant: Tenant, size_gib: int, exclude: Volume | None = None) -> None:
    limit = quota_gib(tenant)
    have = used_gib(tenant, exclude=exclude)
    if have + size_gib > limit:
        raise InvalidInput(
            f"This would hold {have + size_gib} GiB of volumes but your quota allows {limit} GiB "
            f"({have} GiB in use).", code="quota_exceeded",
            fields={"size_gib": [f"At most {max(limit - have, 0)} GiB more."]},
        )


def _lock_tenant(tenant: Tenant) -> None:
    # quota and unique names are checked under the tenant's row lock: two creates take turns
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()


@transaction.atomic
def volume_create(*, tenant: Tenant, name: str, region: str, size_gib: int, user=None) -> Volume:
    reg = Region.objects.filter(code=region, active=True).first()
    if reg is None:
        raise InvalidInput(f"Unknown region {region!r}.", code="unknown_region",
                           fields={"region": [f"No region {region!r}."]})
    _lock_tenant(tenant)
    if Volume.objects.for_tenant(tenant).filter(name=name, deleted_at__isnull=True).exists():
        raise Conflict(f"You already have a volume named {name!r}.", code="volume_name_taken",
                       fields={"name": ["Taken by another of your volumes."]})
    _check_quota(tenant, size_gib)
    volume = Volume.objects.create(tenant=tenant, name=name, region=reg, size_gib=size_gib, created_by=user)
    VolumeSize.objects.create(volume=volume, size_gib=size_gib, effective_from=volume.created_at)
    audit_record(tenant=tenant, action="volume.create", obj=volume, object_repr=name,
                 data={"region": reg.code, "size_gib": size_gib})
    return volume


@transaction.atomic
def volume_resize(*, volume: Volume, size_gib: int) -> Volume:
    """Grow a volume. Shrinking is refused: the data may not fit (and the driver cannot tell)."""
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if size_gib < volume.size_gib:
        raise InvalidInput(f"A volume only grows: it has {volume.size_gib} GiB.", code="volume_shrink",
                           fields={"size_gib": [f"At least {volume.size_gib}."]})
    if size_gib == volume.size_gib:
        return volume
    _lock_tenant(volume.tenant)
    _check_quota(volume.tenant, size_gib, exclude=volume)
    old = volume.size_gib
    now = timezone.now()
    Volume.objects.filter(pk=volume.pk).update(size_gib=size_gib, updated_at=now)
    VolumeSize.objects.create(volume=volume, size_gib=size_gib, effective_from=now)
    volume.size_gib = size_gib
    if volume.host_id:
        # Its over-size verdict may differ now: the host's next volume report is a full one.
        hosts_changed(host_ids=[volume.host_id])
    audit_record(tenant=volume.tenant, action="volume.resize", obj=volume, object_repr=volume.name,
                 data={"from_gib": old, "to_gib": size_gib})
    return volume


def active_attachment(volume: Volume) -> VolumeAttachment | None:
    return (VolumeAttachment.objects.select_related("workload")
            .filter(volume=volume, workload__state__in=ACTIVE).first())


def _attached_words(att: VolumeAttachment) -> str:
    w = att.workload
    return f"{w.kind} {w.name!r} ({w.state})"


@transaction.atomic
def volume_delete(*, volume: Volume) -> None:
    """Soft delete: hidden and no longer billed; the data is purged after the grace period.
    Refused while attached (the data is never deleted under a workload)."""
    volume = Volume.objects.select_for_update().get(pk=volume.pk)
    if volume.deleted_at is not None:
        return
    att = active_attachment(volume)
    if att is not None:
        raise Conflict(f"Volume {volume.name!r} is attached to {_attached_words(att)}; stop it first.",
                       code="volume_attached")
    if open_move(volume.pk) is not None:
        raise Conflict(f"Volume {volume.name!r} is being moved to another host; delete it when the move is done.",
                       code="volume_moving")
    Volume.objects.filter(pk=volume.pk).update(deleted_at=timezone.now())
    audit_record(tenant=volume.tenant, action="volume.delete", obj=volume, object_repr=volume.name,
                 data={"purge_after_s": settings.VOLUME_PURGE_GRACE_S})


def attach_for_launch(*, workload: Workload, volumes: list[dict[str, Any]]) -> None:
    """Attach `volumes` ([{"volume": uuid, "mount_path": str}]) to a new workload, in its launch
    transaction: the mounts its container gets, and its host when a volume already lives on one."""
    if workload.nodes > 1:
        raise InvalidInput("A volume lives on one host: a multi-node job cannot attach one.",
                           fields={"volumes": ["Only single-node work attaches volumes."]})
    for spec in volumes:  # the API checked it; a spec stored before the rule (a group's) is checked here
        try:
            paths.container_path(spec["mount_path"])
        except paths.PathError as e:
            raise InvalidInput(f"Mount path {spec['mount_path']!r}: {e}",
                               fields={"volumes": [f"{spec['mount_path']!r}: {e}"]}) from None
    ids = [v["volume"] for v in volumes]
    found = {v.pk: v for v in Volume.objects.for_tenant(workload.tenant).select_for_update(of=("self",))
             .select_related("host").filter(pk__in=ids, deleted_at__isnull=True).order_by("pk")}
    missing = [str(i) for i in ids if i not in found]
    if missing:
        raise InvalidInput(f"No volume {missing[0]}.", code="unknown_volume",
                           fields={"volumes": [f"No volume {missing[0]}."]})
    hosts = {v.host_id for v in found.values() if v.host_id is not None}
    if len(hosts) > 1:
        raise Conflict("These volumes live on different hosts; one workload cannot use them all.",
                       code="unsatisfiable")
    for v in found.values():
        refuse_if_moving(v)
        if v.region_id != workload.region_id:
            msg = f"Volume {v.name!r} is in {v.region.code}, not in {workload.region.code}."
            raise Conflict(msg, code="unsatisfiable", fields={"volumes": [msg]})
        att = active_attachment(v)
        if att is not None and att.workload_id != workload.pk:
            msg = f"Volume {v.name!r} is attached to {_attached_words(att)}: one writer at a time."
            raise Conflict(msg, code="volume_attached", fields={"volumes": [msg]})
    mounts = []
    for spec in volumes:
        v = found[spec["volume"]]
        VolumeAttachment.objects.create(volume=v, workload=workload, mount_path=spec["mount_path"])
        # past its size (measured: the driver does not enforce it) it is mounted read-only, so the
        # owner can read and delete files but the volume grows no further
        mounts.append({"volume_id": str(v.pk), "name": v.docker_name, "path": spec["mount_path"],
                       "read_only": v.over_size_since is not None})
        audit_record(tenant=workload.tenant, action="volume.attach", obj=v, object_repr=v.name,
                     data={"workload": str(workload.pk), "mount_path": spec["mount_path"]})
    fields: dict[str, Any] = {"mounts": mounts}
    pinned = next((v for v in found.values() if v.host_id is not None), None)
    if pinned is not None:
        fields.update(pinned_host_id=pinned.host_id, pinned_because=f"where volume {pinned.name} lives"[:200])
    Workload.objects.filter(pk=workload.pk).update(**fields)
    for k, val in fields.items():
        setattr(workload, k, val)


def check_start(*, workload: Workload) -> None:
    """A stopped workload going back to the queue: its volumes must be free of other writers."""
    for att in VolumeAttachment.objects.select_related("volume").filter(workload=workload):
        v = Volume.objects.select_for_update().get(pk=att.volume_id)
        if v.deleted_at is not None:
            raise Conflict(f"Volume {v.name!r} was deleted.", code="volume_deleted")
        refuse_if_moving(v)
        other = active_attachment(v)
        if other is not None and other.workload_id != workload.pk:
            raise Conflict(f"Volume {v.name!r} is attached to {_attached_words(other)}: one writer at a time.",
                           code="volume_attached")


def pin_placed(*, hosts: dict[str, str]) -> int:
    """First placement of work using a host-less volume: the volume lives on that host from now
    on, and the workload is pinned to it (a retry or a start goes back there)."""
    rows = list(VolumeAttachment.objects.filter(workload_id__in=list(hosts), volume__host__isnull=True)
                .values_list("volume_id", "workload_id", "volume__name"))
    for volume_id, workload_id, name in rows:
        host = hosts[str(workload_id)]
        Volume.objects.filter(pk=volume_id, host__isnull=True).update(host_id=host)
        Workload.objects.filter(pk=workload_id, pinned_host__isnull=True).update(
            pinned_host_id=host, pinned_because=f"where volume {name} lives"[:200])
    return len(rows)


def record_usage(*, host_id: Any, usage: dict[str, int], now: datetime | None = None) -> list[VolumeEvent]:
    """A host's agent measured its volumes (Docker name -> bytes used). A volume past its size
    gets one `over_size` event (and another once back under and over again)."""
    now = now or timezone.now()
    events = []
    ids = [n[len(DOCKER_PREFIX):] for n in usage if n.startswith(DOCKER_PREFIX)]
    for v in Volume.objects.filter(host_id=host_id, pk__in=ids):
        used = usage[v.docker_name]
        over = used > v.size_gib * 1024**3
        fields: dict[str, Any] = {"used_bytes": used, "measured_at": now}
        if over and v.over_size_since is None:
            fields["over_size_since"] = now
            events.append(VolumeEvent.objects.create(
                volume=v, kind="over_size", created_at=now,
                message=f"{used / 1024**3:.2f} GiB used of {v.size_gib} GiB: the storage driver does not "
                        "enforce the size, so from now on it is mounted read-only until it is back under "
                        "(delete files, or grow the volume)"))
        elif not over and v.over_size_since is not None:
            fields["over_size_since"] = None
        Volume.objects.filter(pk=v.pk).update(**fields)
    return events


def record_measured(*, measured: dict[str, tuple[datetime, list[str]]]) -> int:
    """Hosts measured their volumes again and found what they reported last (host id ->
    (when, Docker names)): the same bytes, so `record_usage` would change only the measuring
    time (the over-size verdict moves with the bytes or the size, and a resize makes the
    next report a full one). One UPDATE for every host of a fast-path flush."""
    hosts, ids, times = [], [], []
    for host_id, (when, names) in measured.items():
        for n in names:
            if n.startswith(DOCKER_PREFIX):
                hosts.append(host_id)
                ids.append(n[len(DOCKER_PREFIX):])
                times.append(when)
    if not ids:
        return 0
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {Volume._meta.db_table} AS v SET measured_at = x.t "
            "FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[]) AS x(host, id, t) "
            "WHERE v.host_id = x.host AND v.id::text = x.id AND (v.measured_at IS NULL OR v.measured_at < x.t)",
            [hosts, ids, times],
        )
        return cur.rowcount


def removed_from_host(*, host_id: Any, present: set[str]) -> int:
    """The host reported its volumes: a purged one it no longer has is gone for good."""
    gone = [v.pk for v in Volume.objects.filter(host_id=host_id, purged_at__isnull=False).only("id")
            if v.docker_name not in present]
    if gone:
        Volume.objects.filter(pk__in=gone).update(host=None)
        transaction.on_commit(lambda: hosts_changed(host_ids=[host_id]))
    return len(gone)


def purge_due(*, now: datetime | None = None) -> list[Volume]:
    """Soft-deleted volumes past the grace period: their data goes (the host's agent removes
    the Docker volume, told in its heartbeat answer). A volume that never got a host has no
    data: purged at once. Returns the volumes marked."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.VOLUME_PURGE_GRACE_S)
    due = list(Volume.objects.filter(deleted_at__lte=cutoff, purged_at__isnull=True))
    hosts = set()
    for v in due:
        Volume.objects.filter(pk=v.pk).update(purged_at=now)
        v.purged_at = now
        audit_record(tenant=v.tenant, action="volume.purge", obj=v, object_repr=v.name,
                     data={"host": str(v.host_id) if v.host_id else None})
        if v.host_id:
            hosts.add(v.host_id)
    if hosts:
        hosts_changed(host_ids=hosts)
    return due


# Seeded per region by `manage.py seed_storage_prices` (and the demo): $0.0001 per GiB-hour,
# about $0.07 per GiB-month. Operators change it in the admin (a new row from a moment on).
STORAGE_PER_GIB_HOUR = Decimal("0.0001")


def storage_prices_seed() -> int:
    """One storage price per active region that has none. Idempotent."""
    made = 0
    for region in Region.objects.filter(active=True):
        if not StoragePrice.objects.filter(region=region).exists():
            StoragePrice.objects.create(region=region, per_gib_hour=STORAGE_PER_GIB_HOUR,
                                        effective_from=datetime(2020, 1, 1, tzinfo=UTC))
            made += 1
    return made


def refuse_if_moving(volume: Volume) -> None:
    """Attaching (launch, start) or deleting waits for a move to end: 409 `volume_moving`."""
    if open_move(volume.pk) is not None:
        raise Conflict(f"Volume {volume.name!r} is being moved to another host; try again when the move is done.",
                       code="volume_moving", fields={"volumes": [f"Volume {volume.name!r} is moving."]})
