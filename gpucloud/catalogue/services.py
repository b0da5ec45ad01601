"""Writes for the catalogue. Operators use the admin; these serve commands and the admin alike."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from gpucloud.catalogue.models import InstanceType, Price, Region
from gpucloud.catalogue.selectors import price_at
from gpucloud.tenancy.audit import audit_record


@transaction.atomic
def price_set(
    *, instance_type: InstanceType, region: Region, kind: str, per_hour: Decimal,
    effective_from: datetime | None = None, currency: str = "USD",
) -> Price | None:
    """Make `per_hour` the price from `effective_from` (default now) on.

    Adds a row; never edits one, so what was billed stays explained. Returns None
    when that price is already in force (nothing to change).
    """
    effective_from = effective_from or timezone.now()
    current = price_at(instance_type=instance_type, region=region, kind=kind, at=effective_from)
    if current is not None and current.per_hour == per_hour and current.currency == currency:
        return None
    price = Price.objects.create(
        instance_type=instance_type, region=region, kind=kind, per_hour=per_hour,
        currency=currency, effective_from=effective_from,
    )
    audit_record(tenant=None, action="price.set", obj=price,
                 data={"per_hour": str(per_hour), "effective_from": effective_from.isoformat()})
    return price
