"""Writes for the catalogue. Operators use the admin; these serve commands and the admin alike."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from gpucloud.catalogue.models import InstanceType, Price, Region
from gpucloud.tenancy.audit import audit_event
from gpucloud.tenancy.models import AuditEvent


def price_set(
    *, instance_type: InstanceType, region: Region, kind: str, per_hour: Decimal,
    effective_from: datetime | None = None, currency: str = "USD",
) -> Price | None:
    """Make `per_hour` the price from `effective_from` (default now) on.

    Adds a row; never edits one, so what was billed stays explained. Returns None
    when that price is already in force (nothing to change).
    """
    made = price_set_many(changes=[PriceChange(instance_type, region, kind, per_hour, currency)],
                          effective_from=effective_from)
    return made[0] if made else None


@dataclass(frozen=True)
class PriceChange:
    instance_type: InstanceType
    region: Region
    kind: str
    per_hour: Decimal
    currency: str = "USD"


@transaction.atomic
def price_set_many(*, changes: list[PriceChange], effective_from: datetime | None = None,
                   keep_existing_kinds: frozenset[str] = frozenset()) -> list[Price]:
    """`price_set` for many prices in a few queries (seeding a catalogue of hundreds):
    the prices in force are read in one query, the new rows and their audit events
    written in one insert each. A change equal to the price in force adds nothing; a
    kind in `keep_existing_kinds` is only set where it has no price yet (spot, once
    offered, moves with demand and is not put back)."""
    effective_from = effective_from or timezone.now()
    type_ids = {c.instance_type.pk for c in changes}
    region_ids = {c.region.pk for c in changes}
    kinds = {c.kind for c in changes}
    in_force: dict[tuple[int, int, str], Price] = {}
    priced: set[tuple[int, int, str]] = set()
    rows = (Price.objects.filter(instance_type_id__in=type_ids, region_id__in=region_ids, kind__in=kinds)
            .order_by("instance_type_id", "region_id", "kind", "-effective_from")
            .only("instance_type_id", "region_id", "kind", "per_hour", "currency", "effective_from"))
    for row in rows:
        key = (row.instance_type_id, row.region_id, row.kind)
        priced.add(key)
        if key not in in_force and row.effective_from <= effective_from:
            in_force[key] = row  # the newest row that has started: the price in force
    made: list[Price] = []
    for c in changes:
        key = (c.instance_type.pk, c.region.pk, c.kind)
        if c.kind in keep_existing_kinds and key in priced:
            continue
        current = in_force.get(key)
        if current is not None and current.per_hour == c.per_hour and current.currency == c.currency:
            continue
        made.append(Price(instance_type=c.instance_type, region=c.region, kind=c.kind, per_hour=c.per_hour,
                          currency=c.currency, effective_from=effective_from))
    Price.objects.bulk_create(made)
    AuditEvent.objects.bulk_create(
        audit_event(tenant=None, action="price.set", obj=price,
                    data={"per_hour": str(price.per_hour), "effective_from": effective_from.isoformat()})
        for price in made
    )
    return made
