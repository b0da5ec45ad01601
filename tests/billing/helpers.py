"""Workloads with a lifecycle written at chosen times, and prices from a chosen moment."""
from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from gpucloud.catalogue.models import InstanceType, Price, Region
from scheduler.choices import State
from scheduler.models import Workload, WorkloadEvent

LONG_AGO = datetime(2024, 1, 1, tzinfo=UTC)


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def set_price(it: str, per_hour: str, since: datetime = LONG_AGO, region: str = "us-east-1",
              kind: str = "on_demand") -> Price:
    return Price.objects.create(instance_type=InstanceType.objects.get(code=it), region=Region.objects.get(code=region),
                                kind=kind, per_hour=Decimal(per_hour), effective_from=since)


def make_run(actor, *, transitions: list[tuple[datetime, str]], it: str = "h100.1x", region: str = "us-east-1",
             billing: str = "on_demand", nodes: int = 1, name: str = "w", kind: str = "instance") -> Workload:
    """A workload created at the first transition's time, moved through `transitions`."""
    created = transitions[0][0]
    w = Workload.objects.create(
        tenant=actor.tenant if hasattr(actor, "tenant") else actor, kind=kind, name=name, image="busybox",
        instance_type=InstanceType.objects.get(code=it), region=Region.objects.get(code=region), billing=billing,
        nodes=nodes, created_at=created, queued_at=created, state=State.PENDING,
    )
    old = ""
    rows = [WorkloadEvent(workload=w, from_state=old, to_state=State.PENDING, created_at=created)]
    old = State.PENDING
    for t, to in transitions[1:]:
        rows.append(WorkloadEvent(workload=w, from_state=old, to_state=to, created_at=t))
        old = to
    WorkloadEvent.objects.bulk_create(rows)
    Workload.objects.filter(pk=w.pk).update(state=old)
    w.refresh_from_db()
    return w


def make_volume(actor, *, sizes: list[tuple[datetime, int]], deleted: datetime | None = None,
                region: str = "us-east-1", name: str = "v"):
    """A volume created at the first size's time, resized at the others, soft-deleted at `deleted`."""
    from volumes.models import Volume, VolumeSize

    tenant = actor.tenant if hasattr(actor, "tenant") else actor
    v = Volume.objects.create(tenant=tenant, name=name, region=Region.objects.get(code=region),
                              size_gib=sizes[-1][1], created_at=sizes[0][0], deleted_at=deleted)
    VolumeSize.objects.bulk_create([VolumeSize(volume=v, size_gib=g, effective_from=t) for t, g in sizes])
    return v


def set_storage_price(per_gib_hour: str, since: datetime = LONG_AGO, region: str = "us-east-1"):
    from volumes.models import StoragePrice

    return StoragePrice.objects.create(region=Region.objects.get(code=region), per_gib_hour=Decimal(per_gib_hour),
                                       effective_from=since)


def volume_exact(v, *, end: int) -> tuple[int, Decimal]:
    """Brute force, second by second: (GiB-seconds, price-seconds) of volume `v` before `end`."""
    import math

    from volumes.models import StoragePrice

    first = math.floor(v.created_at.timestamp())
    last = min(end, math.floor(v.deleted_at.timestamp())) if v.deleted_at else end
    sizes = [(math.floor(s.effective_from.timestamp()), s.size_gib) for s in v.sizes.order_by("effective_from", "id")]
    prices = [(math.ceil(p.effective_from.timestamp()), p.per_gib_hour)
              for p in StoragePrice.objects.filter(region=v.region).order_by("effective_from")]
    gib_s, ps = 0, Decimal(0)
    for t in range(first, last):
        gib = [g for s, g in sizes if s <= t][-1]
        price = [p for s, p in prices if s <= t][-1]
        gib_s += gib
        ps += price * gib
    return gib_s, ps
