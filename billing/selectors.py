"""Reads for billing. Tenant-owned rows only through `tenant=`."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import F, Prefetch, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from billing import metering, pricing
from billing.choices import EntryKind, UsageGroup
from billing.metering import epoch_floor
from billing.models import Account, Budget, Invoice, InvoiceLine, LedgerEntry, Meter, TopUp, VolumeMeter
from billing.services import month_spend
from gpucloud.catalogue.choices import PriceKind
from gpucloud.catalogue.models import Price
from gpucloud.tenancy.models import Tenant
from scheduler.models import WorkloadEvent
from volumes.models import StoragePrice


def ledger_list(*, tenant: Tenant) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.for_tenant(tenant).select_related("instance_type", "region", "workload")


def invoice_list(*, tenant: Tenant) -> QuerySet[Invoice]:
    return Invoice.objects.for_tenant(tenant).select_related("tenant").prefetch_related(
        Prefetch("lines", queryset=InvoiceLine.objects.select_related("instance_type", "region")))


def topup_list(*, tenant: Tenant) -> QuerySet[TopUp]:
    return TopUp.objects.for_tenant(tenant).order_by("-created_at")


def budget_list(*, tenant: Tenant) -> QuerySet[Budget]:
    return Budget.objects.for_tenant(tenant)


def spot_price_list(*, instance_type: str | None = None, region: str | None = None,
                    since: datetime | None = None) -> QuerySet[Price]:
    """Spot price history, newest first: every move the demand formula made."""
    qs = Price.objects.filter(kind=PriceKind.SPOT).select_related("instance_type", "region") \
        .order_by("-effective_from", "instance_type__code", "region__code")
    if instance_type:
        qs = qs.filter(instance_type__code=instance_type)
    if region:
        qs = qs.filter(region__code=region)
    if since:
        qs = qs.filter(effective_from__gte=since)
    return qs


@dataclass(frozen=True)
class BudgetStatus:
    budget: Budget
    spend: Decimal
    percent: Decimal


@dataclass(frozen=True)
class BalanceView:
    balance: Decimal
    currency: str
    low: bool
    exhausted_since: datetime | None
    month_to_date: Decimal
    budgets: list[BudgetStatus]


def balance_get(*, tenant: Tenant, now: datetime | None = None) -> BalanceView:
    now = now or timezone.now()
    account = Account.objects.filter(tenant=tenant).first()
    balance = account.balance if account else Decimal(0)
    spend = month_spend(tenant_id=tenant.pk, at=now)
    budgets = [BudgetStatus(budget=b, spend=spend, percent=(spend * 100 / b.monthly_amount).quantize(Decimal("0.1")))
               for b in budget_list(tenant=tenant)]
    return BalanceView(balance=pricing.cents(balance), currency=settings.BILLING_CURRENCY,
                       low=balance < settings.BILLING_LOW_BALANCE,
                       exhausted_since=account.exhausted_since if account else None,
                       month_to_date=spend, budgets=budgets)


@dataclass(frozen=True)
class UsageRow:
    key: str
    label: str
    seconds: int
    gpu_hours: Decimal
    amount: Decimal


def usage(*, tenant: Tenant, start: datetime, end: datetime, group_by: str) -> list[UsageRow]:
    """Usage posted for slices starting in [start, end), grouped. Slices never cross a UTC day."""
    qs = LedgerEntry.objects.for_tenant(tenant).filter(kind=EntryKind.USAGE, period_start__gte=start,
                                                       period_start__lt=end)
    keys = {
        UsageGroup.INSTANCE_TYPE: ("instance_type__code", "instance_type__name"),
        UsageGroup.REGION: ("region__code", "region__name"),
        UsageGroup.INSTANCE: ("workload_id", "workload__name"),
    }
    if group_by == UsageGroup.DAY:
        qs = qs.annotate(k=TruncDate("period_start", tzinfo=UTC))
        fields = ("k", "k")
    else:
        fields = keys[group_by]
    rows = (qs.values(*fields).annotate(s=Sum("seconds"), gms=Sum(F("gpu_milli") * F("seconds")),
                                        ps=Sum("price_seconds"), a=Sum("amount"))
            .order_by(fields[0]))
    return [
        UsageRow(key=str(r[fields[0]]), label=str(r[fields[1]]), seconds=int(r["s"] or 0),
                 gpu_hours=pricing.gpu_hours(gpu_milli_seconds=int(r["gms"] or 0)),
                 amount=pricing.cents(-(r["a"] or Decimal(0))))
        for r in rows
    ]


@dataclass(frozen=True)
class Cost:
    hourly: Decimal | None  # 4 places like prices; None when no price is in force
    so_far: Decimal


def launched_cost(*, workload: Any, per_hour: Decimal | None) -> Cost:
    """What `workload_costs` says of a workload just launched, without asking the database:
    nothing posted, nothing run, the price in force now (`per_hour`, read by the launch)."""
    return Cost(hourly=None if per_hour is None else per_hour * workload.nodes,
                so_far=pricing.cents(Decimal(0)))


def workload_costs(*, workloads: Sequence[Any], now: datetime | None = None) -> dict[Any, Cost]:
    """Hourly price now and cost so far for each workload, in four queries whatever their number.

    cost so far = what the ledger posted + the running seconds metering has not posted yet
    (after its watermark, up to now: every run in that span, from the transition log, by the
    rules of billing/metering.py) at today's price. It never goes backwards when a run ends or
    a stopped instance starts again. An estimate until metered; the ledger is the bill.
    """
    now = now or timezone.now()
    if not workloads:
        return {}
    ids = [w.pk for w in workloads]
    pairs = {(w.instance_type_id, w.region_id, w.billing) for w in workloads}
    prices: dict[tuple[int, int, str], Decimal] = {}
    for it, region, kind, per_hour in (
        Price.objects.filter(instance_type_id__in={p[0] for p in pairs}, region_id__in={p[1] for p in pairs},
                             effective_from__lte=now)
        .order_by("instance_type_id", "region_id", "kind", "-effective_from")
        .values_list("instance_type_id", "region_id", "kind", "per_hour")
    ):
        prices.setdefault((it, region, kind), per_hour)
    posted: dict[Any, Decimal] = defaultdict(Decimal)
    for wid, amount in LedgerEntry.objects.filter(workload_id__in=ids).values("workload_id") \
            .annotate(a=Sum("amount")).values_list("workload_id", "a"):
        posted[wid] = -(amount or Decimal(0))
    watermarks = dict(Meter.objects.filter(pk__in=ids).values_list("pk", "metered_until"))
    # What metering has not posted yet is read from the same transition log metering reads,
    # by the same pure rule (billing/metering.py): the running seconds after the watermark
    # (after the workload's creation while no meter is open, as `meters_discover` opens it),
    # every run in it, up to now. When metering catches up, the seconds it posts leave this
    # part as they enter the ledger: nothing counted twice, nothing dropped. (Before, only the
    # last run counted, from `started_at`: a start, which clears `started_at`, showed 0.00 until
    # metering caught up with the run before it.)
    events: dict[Any, list[tuple[int, str]]] = defaultdict(list)
    for wid, t, state in (WorkloadEvent.objects.filter(workload_id__in=ids).order_by("workload_id", "created_at", "id")
                          .values_list("workload_id", "created_at", "to_state")):
        events[wid].append((epoch_floor(t), state))
    end = epoch_floor(now)
    out = {}
    for w in workloads:
        per_hour = prices.get((w.instance_type_id, w.region_id, w.billing))
        hourly = None if per_hour is None else per_hour * w.nodes
        so_far = posted[w.pk]
        if hourly is not None:
            since = epoch_floor(watermarks.get(w.pk, w.created_at))
            so_far += hourly * metering.running_seconds(events[w.pk], start=since, end=end) / 3600
        out[w.pk] = Cost(hourly=hourly, so_far=pricing.cents(so_far))
    return out


# ---------------------------------------------------------------- storage (volumes)


@dataclass(frozen=True)
class StorageUsage:
    gib_hours: Decimal
    seconds: int
    amount: Decimal  # cents


def storage_usage(*, tenant: Tenant, start: datetime, end: datetime) -> StorageUsage:
    """Volumes' posted storage for slices starting in [start, end): the usage page's and the
    API's storage row (an invoice's storage lines, summed)."""
    r = (LedgerEntry.objects.for_tenant(tenant)
         .filter(kind=EntryKind.STORAGE, period_start__gte=start, period_start__lt=end)
         .aggregate(s=Sum("seconds"), gs=Sum(F("gib") * F("seconds")), a=Sum("amount")))
    return StorageUsage(gib_hours=(Decimal(r["gs"] or 0) / 3600).quantize(Decimal("0.0001")),
                        seconds=int(r["s"] or 0), amount=pricing.cents(-(r["a"] or Decimal(0))))


def storage_prices(*, region_ids: Any, now: datetime | None = None) -> dict[Any, Decimal]:
    """The storage price in force now per GiB-hour, by region (a region without one is absent)."""
    now = now or timezone.now()
    out: dict[Any, Decimal] = {}
    for region_id, per_gib_hour in (StoragePrice.objects.filter(region_id__in=list(region_ids), effective_from__lte=now)
                                    .order_by("region_id", "-effective_from").values_list("region_id", "per_gib_hour")):
        out.setdefault(region_id, per_gib_hour)
    return out


@dataclass(frozen=True)
class VolumeCost:
    per_gib_hour: Decimal | None  # the region's storage price now; None when none is in force
    hourly: Decimal | None  # per_gib_hour × its size
    so_far: Decimal  # cents: posted + the seconds after its watermark at today's price


def volume_costs(*, volumes: Sequence[Any], now: datetime | None = None) -> dict[Any, VolumeCost]:
    """What each volume costs an hour now and has cost so far, in three queries for a page.

    As for instances (`workload_costs`): what the ledger posted plus the seconds metering has
    not posted yet (after its watermark, or its creation), at today's price and size: an
    estimate until metered; the ledger is the bill."""
    now = now or timezone.now()
    if not volumes:
        return {}
    ids = [v.pk for v in volumes]
    prices = storage_prices(region_ids={v.region_id for v in volumes}, now=now)
    posted: dict[Any, Decimal] = defaultdict(Decimal)
    for vid, amount in (LedgerEntry.objects.filter(volume_id__in=ids, kind=EntryKind.STORAGE).values("volume_id")
                        .annotate(a=Sum("amount")).values_list("volume_id", "a")):
        posted[vid] = -(amount or Decimal(0))
    watermarks = dict(VolumeMeter.objects.filter(pk__in=ids).values_list("pk", "metered_until"))
    out = {}
    for v in volumes:
        price = prices.get(v.region_id)
        hourly = None if price is None else price * v.size_gib
        so_far = posted[v.pk]
        if hourly is not None:
            until = min(now, v.deleted_at) if v.deleted_at else now
            unposted = max(0, epoch_floor(until) - epoch_floor(watermarks.get(v.pk, v.created_at)))
            so_far += hourly * unposted / 3600
        out[v.pk] = VolumeCost(per_gib_hour=price, hourly=hourly, so_far=pricing.cents(so_far))
    return out
