"""Metering of volumes: GiB-seconds on the same ledger, exactly once.

The rules of billing/metering.py, per volume: a second is billed iff the volume existed at
its start (from its creation until its soft delete, both floored to the second), at its size
then (`volumes.VolumeSize`, floored: a resize counts from its own second) times the region's
storage price in force then (`volumes.StoragePrice`, ceiled like instance prices). Slices are
cut at size changes, price changes and UTC midnights; money is rounded only from the volume's
cumulative price-seconds. A `VolumeMeter` watermark moves in the same transaction as the
ledger entries it covers (`ledger_storage_slice_once` makes a slice unique), so a run killed
anywhere posted a window whole or not at all, and the next run finishes it.
"""
from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing import metering
from billing.accounts import ledger_post
from billing.choices import EntryKind
from billing.metering import epoch_ceil, epoch_floor, from_epoch
from billing.models import LedgerEntry, VolumeMeter
from volumes.models import StoragePrice, Volume, VolumeSize

logger = logging.getLogger(__name__)

EXISTS = "running"  # the metering module's word for a billable second


def storage_meters_discover() -> int:
    """A meter for every volume that has none, from its creation (second, floored)."""
    new = [VolumeMeter(volume_id=pk, tenant_id=tenant_id, metered_until=from_epoch(epoch_floor(created)))
           for pk, tenant_id, created in Volume.objects.filter(meter__isnull=True)
           .values_list("id", "tenant_id", "created_at")]
    VolumeMeter.objects.bulk_create(new, ignore_conflicts=True)
    return len(new)


def volume_rates(*, volume_id: UUID, region_id: int) -> list[tuple[int, Decimal, int]]:
    """(second, per_hour, GiB) from each change of size or price on: per_hour = GiB × price."""
    sizes = [(epoch_floor(t), g) for t, g in VolumeSize.objects.filter(volume_id=volume_id)
             .order_by("effective_from", "id").values_list("effective_from", "size_gib")]
    prices = [(epoch_ceil(t), p) for t, p in StoragePrice.objects.filter(region_id=region_id)
              .order_by("effective_from").values_list("effective_from", "per_gib_hour")]
    out = []
    for t in sorted({t for t, _ in sizes} | {t for t, _ in prices}):
        gib = metering.price_at([(s, Decimal(g)) for s, g in sizes], t)
        price = metering.price_at(prices, t)
        if gib is None or price is None:
            continue
        out.append((t, price * gib, int(gib)))
    return out


def meter_volume(*, volume_id: UUID, cutoff: datetime) -> tuple[int, Decimal]:
    """Post the volume's GiB-seconds in [watermark, cutoff). Idempotent; one transaction."""
    with transaction.atomic():
        meter = VolumeMeter.objects.select_for_update().filter(pk=volume_id).first()
        if meter is None or meter.metered_until >= cutoff:
            return 0, Decimal(0)
        v = Volume.objects.filter(pk=volume_id).values("tenant_id", "region_id", "created_at", "deleted_at").get()
        events = [(epoch_floor(v["created_at"]), EXISTS)]
        if v["deleted_at"] is not None:
            events.append((epoch_floor(v["deleted_at"]), "deleted"))
        rates = volume_rates(volume_id=volume_id, region_id=v["region_id"])
        start, end = epoch_floor(meter.metered_until), epoch_floor(cutoff)
        try:
            parts = metering.slices(events=events, prices=[(t, p) for t, p, _ in rates], start=start, end=end)
        except metering.MeteringError:
            logger.error("volume %s has seconds with no storage price in force (seed_storage_prices)", volume_id)
            return 0, Decimal(0)
        money = metering.amounts(parts, nodes=1, cumulative=meter.price_seconds)
        entries = []
        gib_seconds = 0
        for part, (ps, amount) in zip(parts, money, strict=True):
            gib = next(g for t, _p, g in reversed(rates) if t <= part.start)
            gib_seconds += gib * part.seconds
            entries.append(LedgerEntry(
                tenant_id=v["tenant_id"], kind=EntryKind.STORAGE, amount=-amount, volume_id=volume_id,
                region_id=v["region_id"], per_hour=part.per_hour, gib=gib,
                period_start=from_epoch(part.start), period_end=from_epoch(part.end), seconds=part.seconds,
                price_seconds=ps, memo=f"volume: {gib} GiB for {part.seconds} s at {part.per_hour}/h",
            ))
        total = sum((a for _, a in money), Decimal(0))
        if entries:
            ledger_post(tenant_id=v["tenant_id"], entries=entries)
        done = v["deleted_at"] is not None and epoch_floor(v["deleted_at"]) <= end
        VolumeMeter.objects.filter(pk=volume_id).update(
            metered_until=cutoff, price_seconds=F("price_seconds") + sum((ps for ps, _ in money), Decimal(0)),
            amount=F("amount") + total, gib_seconds=F("gib_seconds") + gib_seconds, done=done,
            updated_at=timezone.now())
        return len(entries), total


def storage_metering_run(*, cutoff: datetime) -> tuple[int, int, Decimal]:
    """Meter every open volume to `cutoff`: (volumes metered, entries, amount)."""
    storage_meters_discover()
    metered = entries = 0
    amount = Decimal(0)
    for pk in list(VolumeMeter.objects.filter(done=False, metered_until__lt=cutoff)
                   .order_by("pk").values_list("pk", flat=True)):
        n, a = meter_volume(volume_id=pk, cutoff=cutoff)
        metered += 1
        entries += n
        amount += a
    return metered, entries, amount
