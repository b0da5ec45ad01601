"""Writes for billing: credits, the launch check, metering, enforcement, spot prices,
invoices and budgets. The arithmetic is in billing/pricing.py and billing/metering.py.

Every ledger entry is added with `_post`, which moves `Account.balance` in the same
transaction, so the balance is always the sum of the entries. No network I/O here
inside a transaction: notifications and payments go to tasks on commit.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Sum
from django.db.models.functions import TruncMonth
from django.utils import timezone

from agents.models import Gpu
from billing import metering, pricing
from billing.accounts import account_for, launch_blocks_refresh, ledger_post, ledger_post_many
from billing.alerts import budget_alert_deliver_task, low_balance_notify_task
from billing.choices import EntryKind, InvoiceStatus, TopUpStatus
from billing.metering import epoch_ceil, epoch_floor, from_epoch
from billing.models import (
    Account,
    Budget,
    BudgetAlert,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    Meter,
    MeteringCursor,
    SpotFloor,
    TopUp,
)
from billing.payments import InvalidEvent, TopUpStart, get_provider
from billing.storage import storage_metering_run
from gpucloud.catalogue.choices import PriceKind
from gpucloud.catalogue.models import InstanceType, Price
from gpucloud.lib.errors import InvalidInput
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.models import Tenant
from scheduler.choices import Billing, State
from scheduler.models import RegionSchedulerSettings, Workload, WorkloadEvent
from scheduler.services import Notice, workload_stop, workloads_notice

logger = logging.getLogger(__name__)

def month_start(d: date | datetime) -> date:
    return date(d.year, d.month, 1)


def next_month(d: date) -> date:
    return date(d.year + (d.month == 12), d.month % 12 + 1, 1)


def _midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def month_began(at: datetime) -> datetime:
    """Where "this month" begins (midnight UTC on the 1st): for budgets, usage and the console alike."""
    return _midnight(month_start(at))


# ---------------------------------------------------------------- accounts and the ledger


def _post(*, tenant_id: Any, kind: str, amount: Decimal, memo: str = "", **usage: Any) -> LedgerEntry:
    """Append one entry and move the balance by it. Call inside atomic()."""
    [entry] = ledger_post(tenant_id=tenant_id, entries=[
        LedgerEntry(tenant_id=tenant_id, kind=kind, amount=amount, memo=memo[:300], **usage)])
    return entry


@transaction.atomic
def credit_grant(*, tenant: Tenant, amount: Decimal, memo: str = "", kind: str = EntryKind.CREDIT) -> LedgerEntry:
    """An operator adds credit (or records a payment, or corrects with an adjustment)."""
    if kind not in (EntryKind.CREDIT, EntryKind.PAYMENT, EntryKind.ADJUSTMENT):
        raise InvalidInput("Only credits, payments and adjustments are granted by hand.",
                           fields={"kind": ["Not a manual entry kind."]})
    if kind != EntryKind.ADJUSTMENT and amount <= 0:
        raise InvalidInput("A credit is a positive amount.", fields={"amount": ["Must be positive."]})
    entry = _post(tenant_id=tenant.pk, kind=kind, amount=amount.quantize(pricing.MICRO), memo=memo)
    audit_record(tenant=tenant, action=f"billing.{kind}", obj=entry,
                 data={"amount": str(amount), "memo": memo[:200]})
    return entry


def signup_credit_grant(*, tenant: Tenant) -> LedgerEntry | None:
    """A new tenant's welcome credit (BILLING_SIGNUP_CREDIT). Call inside tenant creation."""
    account_for(tenant_id=tenant.pk)
    amount = settings.BILLING_SIGNUP_CREDIT
    if amount <= 0:
        return None
    return _post(tenant_id=tenant.pk, kind=EntryKind.SIGNUP_CREDIT, amount=amount.quantize(pricing.MICRO),
                 memo="sign-up credit")


def month_spends(*, tenant_ids: Any, at: datetime) -> dict[Any, Decimal]:
    """What each tenant's usage cost this calendar month (UTC) so far, in cents: the spend
    budgets are measured against (balance, console, budget checks and changes alike)."""
    asked = {str(tenant_id): tenant_id for tenant_id in tenant_ids}  # ids as the caller holds them
    spent = dict.fromkeys(asked, Decimal(0))
    for tenant_id, total in (LedgerEntry.objects.filter(tenant_id__in=list(asked), kind=EntryKind.USAGE,
                                                         period_start__gte=month_began(at))
                             .values("tenant_id").annotate(s=Sum("amount")).values_list("tenant_id", "s")):
        spent[str(tenant_id)] = -(total or Decimal(0))
    return {asked[key]: pricing.cents(total) for key, total in spent.items()}


def month_spend(*, tenant_id: Any, at: datetime) -> Decimal:
    """What the tenant's usage cost this calendar month (UTC) so far, in cents."""
    return month_spends(tenant_ids=[tenant_id], at=at)[tenant_id]


# ---------------------------------------------------------------- metering


@dataclass
class MeteringStats:
    cutoff: datetime
    discovered: int = 0
    metered: int = 0
    entries: int = 0
    amount: Decimal = Decimal(0)
    seconds: float = 0.0
    stopped: list[str] = field(default_factory=list)


def metering_cutoff(now: datetime) -> datetime:
    """The end of the last closed window: METERING_SETTLE_S behind `now`, on the interval grid."""
    t = epoch_floor(now) - settings.METERING_SETTLE_S
    step = max(1, settings.METERING_INTERVAL_S)
    return from_epoch(t - t % step)


def meters_discover(*, cutoff: datetime) -> int:
    """Open a meter for every workload that entered RUNNING since the last scan.

    Scans the transition log from the cursor to `cutoff` and advances the cursor in
    the same transaction. A meter starts at its workload's creation: no second before
    that can have been RUNNING.
    """
    with transaction.atomic():
        cursor, _ = MeteringCursor.objects.get_or_create(name="default", defaults={"events_until": metering.EPOCH})
        cursor = MeteringCursor.objects.select_for_update().get(pk=cursor.pk)
        if cursor.events_until >= cutoff:
            return 0
        ids = set(
            WorkloadEvent.objects.filter(to_state=State.RUNNING, created_at__gte=cursor.events_until,
                                         created_at__lt=cutoff).values_list("workload_id", flat=True)
        )
        existing = set(Meter.objects.filter(pk__in=ids).values_list("pk", flat=True))
        if existing:
            Meter.objects.filter(pk__in=existing, done=True).update(done=False)
        new = [
            Meter(workload_id=wid, tenant_id=tenant_id, metered_until=from_epoch(epoch_floor(created)))
            for wid, tenant_id, created in Workload.objects.filter(pk__in=ids - existing)
            .values_list("id", "tenant_id", "created_at")
        ]
        Meter.objects.bulk_create(new, ignore_conflicts=True)
        cursor.events_until = cutoff
        cursor.save(update_fields=["events_until", "updated_at"])
        return len(new)


@dataclass
class _Window:
    """What one meter posts for [watermark, cutoff): its entries and the meter's new totals."""

    entries: list[LedgerEntry]
    amount: Decimal
    price_seconds: Decimal
    seconds: int
    done: bool


def meters_post(*, workload_ids: list[UUID], cutoff: datetime) -> tuple[int, int, Decimal]:
    """Post the running seconds in [watermark, cutoff) of these workloads' meters, all in one
    transaction and a fixed number of statements. Idempotent.

    The meters still behind `cutoff` are locked in key order (concurrent runs lock in the same
    order; one that waited re-reads the watermark and skips what the other posted); the
    workloads, their transitions and their prices are read in one query each; the slices and
    amounts are computed per workload exactly as billing/metering.py says; the entries go
    through `ledger_post_many` (one insert, one balance update); the watermarks move in one
    update. Killed anywhere, the chunk posted whole or not at all; run twice, the second finds
    every watermark at `cutoff` and posts nothing. Returns (meters moved, entries, amount).
    """
    with transaction.atomic():
        meters = list(Meter.objects.select_for_update().filter(pk__in=workload_ids, metered_until__lt=cutoff)
                      .order_by("pk").values_list("pk", "metered_until", "price_seconds"))
        if not meters:
            return 0, 0, Decimal(0)
        ids = [pk for pk, _until, _ps in meters]
        workloads = {w["id"]: w for w in Workload.objects.filter(pk__in=ids).values(
            "id", "tenant_id", "instance_type_id", "region_id", "billing", "nodes",
            "instance_type__gpu_count", "instance_type__gpu_share_milli")}
        events: dict[UUID, list[tuple[int, str]]] = {pk: [] for pk in ids}
        for wid, t, state in (WorkloadEvent.objects.filter(workload_id__in=ids)
                              .order_by("workload_id", "created_at", "id")
                              .values_list("workload_id", "created_at", "to_state")):
            events[wid].append((epoch_floor(t), state))
        prices: dict[tuple[int, int, str], list[tuple[int, Decimal]]] = {
            (w["instance_type_id"], w["region_id"], w["billing"]): [] for w in workloads.values()}
        for it, region, kind, t, per_hour in (Price.objects.filter(
                instance_type_id__in={k[0] for k in prices}, region_id__in={k[1] for k in prices},
                kind__in={k[2] for k in prices}).order_by("effective_from")
                .values_list("instance_type_id", "region_id", "kind", "effective_from", "per_hour")):
            if (it, region, kind) in prices:
                prices[it, region, kind].append((epoch_ceil(t), per_hour))
        end = epoch_floor(cutoff)
        windows = {pk: _window(workload_id=pk, w=workloads[pk], events=events[pk],
                               prices=prices[workloads[pk]["instance_type_id"], workloads[pk]["region_id"],
                                             workloads[pk]["billing"]],
                               start=epoch_floor(until), end=end, cumulative=cumulative)
                   for pk, until, cumulative in meters}
        by_tenant: dict[Any, list[LedgerEntry]] = {}
        for pk, window in windows.items():
            if window.entries:
                by_tenant.setdefault(workloads[pk]["tenant_id"], []).extend(window.entries)
        ledger_post_many(entries_by_tenant=by_tenant)
        _meters_advance(windows=windows, cutoff=cutoff)
        return (len(windows), sum(len(w.entries) for w in windows.values()),
                sum((w.amount for w in windows.values()), Decimal(0)))


def _window(*, workload_id: UUID, w: dict[str, Any], events: list[tuple[int, str]],
            prices: list[tuple[int, Decimal]], start: int, end: int, cumulative: Decimal) -> _Window:
    """One workload's slices of [start, end) as ledger entries (pure arithmetic on what was read)."""
    parts = metering.slices(events=events, prices=prices, start=start, end=end)
    money = metering.amounts(parts, nodes=w["nodes"], cumulative=cumulative)
    gpu_milli = w["instance_type__gpu_count"] * w["instance_type__gpu_share_milli"] * w["nodes"]
    entries = [
        LedgerEntry(
            tenant_id=w["tenant_id"], kind=EntryKind.USAGE, amount=-amount, workload_id=workload_id,
            instance_type_id=w["instance_type_id"], region_id=w["region_id"], price_kind=w["billing"],
            per_hour=part.per_hour, nodes=w["nodes"], gpu_milli=gpu_milli,
            period_start=from_epoch(part.start), period_end=from_epoch(part.end), seconds=part.seconds,
            price_seconds=ps, memo=f"{part.seconds} s at {part.per_hour}/h",
        )
        for part, (ps, amount) in zip(parts, money, strict=True)
    ]
    # Done when the last transition left RUNNING at or before the window's end: nothing
    # after it can be billable until a new RUNNING reopens the meter (meters_discover).
    last = events[-1] if events else None
    return _Window(entries=entries, amount=sum((a for _, a in money), Decimal(0)),
                   price_seconds=cumulative + sum((ps for ps, _ in money), Decimal(0)),
                   seconds=sum(p.seconds for p in parts),
                   done=last is not None and last[1] != State.RUNNING and last[0] <= end)


def _meters_advance(*, windows: dict[UUID, _Window], cutoff: datetime) -> None:
    """Move the locked meters' watermarks to `cutoff` and add what was posted, in one UPDATE
    from arrays (the rows are locked by this transaction, so adding to them is exact)."""
    now = timezone.now()
    if connection.vendor != "postgresql":  # the SQLite demo: one update per meter
        for pk, w in windows.items():
            Meter.objects.filter(pk=pk).update(
                metered_until=cutoff, price_seconds=w.price_seconds, amount=F("amount") + w.amount,
                seconds=F("seconds") + w.seconds, done=w.done, updated_at=now)
        return
    table = connection.ops.quote_name(Meter._meta.db_table)
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {table} m SET metered_until = %s, price_seconds = v.price_seconds,"
            " amount = m.amount + v.amount, seconds = m.seconds + v.seconds, done = v.done, updated_at = %s"
            " FROM unnest(%s::uuid[], %s::numeric[], %s::numeric[], %s::bigint[], %s::boolean[])"
            " AS v(workload_id, price_seconds, amount, seconds, done) WHERE m.workload_id = v.workload_id",
            [cutoff, now, list(windows), [w.price_seconds for w in windows.values()],
             [w.amount for w in windows.values()], [w.seconds for w in windows.values()],
             [w.done for w in windows.values()]],
        )


def metering_run(*, now: datetime | None = None) -> MeteringStats:
    """Post every closed window of usage, then apply what the new balances mean.

    Safe to run again at any time, and from any number of workers at once.
    """
    t0 = time.perf_counter()
    posted_since = timezone.now()  # entries this run adds are stamped from here on
    now = now or timezone.now()
    cutoff = metering_cutoff(now)
    stats = MeteringStats(cutoff=cutoff)
    stats.discovered = meters_discover(cutoff=cutoff)
    # In key order and in chunks of METERING_CHUNK meters, a transaction each: concurrent runs
    # lock meters in the same order, a run's progress is predictable, and no run holds its
    # locks (meters, accounts) for longer than one chunk.
    todo = list(Meter.objects.filter(done=False, metered_until__lt=cutoff).order_by("pk").values_list("pk", flat=True))
    step = max(1, settings.METERING_CHUNK)
    for i in range(0, len(todo), step):
        metered, entries, amount = meters_post(workload_ids=todo[i:i + step], cutoff=cutoff)
        stats.metered += metered
        stats.entries += entries
        stats.amount += amount
    _n, stored, stored_amount = storage_metering_run(cutoff=cutoff)  # volumes: GiB-seconds
    stats.entries += stored
    stats.amount += stored_amount
    if stats.entries:
        invoices_follow(posted_since=posted_since)
    stats.stopped = balances_enforce(now=now)
    budgets_check(now=now)
    stats.seconds = time.perf_counter() - t0
    logger.info("metering cutoff=%s discovered=%d metered=%d entries=%d amount=%s stopped=%d seconds=%.3f",
                cutoff.isoformat(), stats.discovered, stats.metered, stats.entries, stats.amount,
                len(stats.stopped), stats.seconds)
    return stats


# ---------------------------------------------------------------- low and exhausted balances


_STOPPABLE = (State.PENDING, State.SCHEDULED, State.STARTING, State.RUNNING)


def balances_enforce(*, now: datetime) -> list[str]:
    """Warn on low balances; at zero stop spot work at once and on-demand after the grace.

    Returns the ids of the workloads it stopped.
    """
    low = settings.BILLING_LOW_BALANCE
    with transaction.atomic():
        Account.objects.filter(balance__gt=0, exhausted_since__isnull=False).update(exhausted_since=None)
        Account.objects.filter(balance__lte=0, exhausted_since__isnull=True).update(exhausted_since=now)
        Account.objects.filter(balance__gte=low, low_balance_notified_at__isnull=False).update(
            low_balance_notified_at=None)
        warn = list(Account.objects.filter(balance__lt=low, low_balance_notified_at__isnull=True)
                    .values_list("tenant_id", flat=True))
        if warn:
            Account.objects.filter(tenant_id__in=warn).update(low_balance_notified_at=now)
            for tenant_id in warn:
                transaction.on_commit(lambda t=str(tenant_id): low_balance_notify_task.delay(t))
    stopped: list[str] = []
    grace = timedelta(seconds=settings.BILLING_GRACE_S)
    for tenant_id, since in Account.objects.filter(exhausted_since__isnull=False).values_list(
            "tenant_id", "exhausted_since"):
        todo = Workload.objects.filter(tenant_id=tenant_id, state__in=_STOPPABLE)
        if now - since < grace:
            todo = todo.filter(billing=Billing.SPOT)  # spot first: on-demand keeps its grace
        for w in todo:
            workload_stop(workload=w, reason="stopped: the tenant's balance is exhausted; add credit")
            stopped.append(str(w.pk))
    return stopped


# ---------------------------------------------------------------- budgets


def budgets_check(*, now: datetime) -> int:
    """Record each threshold a budget crossed this month (once) and deliver its alert after
    commit; flag tenants whose hard-stop budget is spent. Returns the alerts created."""
    month = month_start(now)
    created = 0
    with transaction.atomic():
        budgets = list(Budget.objects.all())
        spends = month_spends(tenant_ids={b.tenant_id for b in budgets}, at=now) if budgets else {}
        blocked = set()
        for budget in budgets:
            spend = spends[budget.tenant_id]
            percent = spend * 100 / budget.monthly_amount
            if budget_spent(budget=budget, spend=spend):
                blocked.add(budget.tenant_id)
            for threshold in sorted(set(budget.thresholds)):
                if percent < threshold:
                    continue
                alert, new = BudgetAlert.objects.get_or_create(
                    budget=budget, month=month, threshold=threshold, defaults={"spend": spend})
                if new:
                    created += 1
                    transaction.on_commit(lambda a=alert.pk: budget_alert_deliver_task.delay(a))
        lifted = list(Account.objects.filter(budget_blocked=True).exclude(tenant_id__in=blocked)
                      .values_list("tenant_id", flat=True))
        Account.objects.filter(tenant_id__in=lifted).update(budget_blocked=False)
        if blocked:
            for tenant_id in blocked:
                account_for(tenant_id=tenant_id)
            Account.objects.filter(tenant_id__in=blocked, budget_blocked=False).update(budget_blocked=True)
        launch_blocks_refresh(tenant_ids={*lifted, *blocked})
    return created


def budget_spent(*, budget: Budget, spend: Decimal) -> bool:
    """The budget rule: a hard-stop budget whose month's spend reached its amount stops launches."""
    return budget.hard_stop and spend >= budget.monthly_amount


def _budget_block_refresh(*, tenant_id: Any) -> None:
    """Decide `Account.budget_blocked` for one tenant now (after its budgets changed), and push
    the verdict down: the API and the scheduler agree at once, not after the next metering."""
    budgets = list(Budget.objects.filter(tenant_id=tenant_id, hard_stop=True))
    spend = month_spend(tenant_id=tenant_id, at=timezone.now()) if budgets else Decimal(0)
    spent = any(budget_spent(budget=b, spend=spend) for b in budgets)
    if spent:
        account_for(tenant_id=tenant_id)
    Account.objects.filter(tenant_id=tenant_id).exclude(budget_blocked=spent).update(budget_blocked=spent)
    launch_blocks_refresh(tenant_ids=[tenant_id])


@transaction.atomic
def budget_create(*, tenant: Tenant, **values: Any) -> Budget:
    budget = Budget.objects.create(tenant=tenant, **values)
    audit_record(tenant=tenant, action="budget.create", obj=budget,
                 data={"monthly_amount": str(budget.monthly_amount), "hard_stop": budget.hard_stop})
    _budget_block_refresh(tenant_id=tenant.pk)
    return budget


@transaction.atomic
def budget_update(*, budget: Budget, **values: Any) -> Budget:
    for key, value in values.items():
        setattr(budget, key, value)
    budget.save()
    audit_record(tenant=budget.tenant, action="budget.update", obj=budget,
                 data={k: str(v) for k, v in values.items() if k != "webhook_secret"})
    _budget_block_refresh(tenant_id=budget.tenant_id)
    return budget


@transaction.atomic
def budget_delete(*, budget: Budget) -> None:
    audit_record(tenant=budget.tenant, action="budget.delete", obj=budget)
    budget.delete()
    _budget_block_refresh(tenant_id=budget.tenant_id)


# ---------------------------------------------------------------- spot prices


def spot_prices_update(*, now: datetime | None = None) -> int:
    """Recompute spot prices from demand (pricing.spot_price); a change is a new Price row.

    Then spot work whose max price is now below the price gets the usual preemption
    notice. Returns the number of prices changed.
    """
    now = now or timezone.now()
    demand: dict[tuple[int, int], tuple[int, int]] = {}
    for region_id, model_id, used, count in (
        Gpu.objects.filter(healthy=True).values("host__region_id", "gpu_model_id")
        .annotate(used=Sum("used_milli"), n=Count("uuid")).values_list("host__region_id", "gpu_model_id", "used", "n")
    ):
        demand[(region_id, model_id)] = (int(used or 0), int(count) * 1000)
    floors = {(r, m): f for r, m, f in SpotFloor.objects.values_list("region_id", "gpu_model_id", "floor_fraction")}
    # the price in force per (type, region, kind): newest first, keep the first seen
    current: dict[tuple[int, int, str], Decimal] = {}
    for it, region, kind, per_hour in (
        Price.objects.filter(effective_from__lte=now).order_by("instance_type_id", "region_id", "kind",
                                                                "-effective_from")
        .values_list("instance_type_id", "region_id", "kind", "per_hour")
    ):
        current.setdefault((it, region, kind), per_hour)
    model_of = dict(InstanceType.objects.values_list("id", "gpu_model_id"))
    changed = []
    for (it, region, kind), spot in current.items():
        if kind != PriceKind.SPOT or (it, region, PriceKind.ON_DEMAND) not in current:
            continue  # only types already offered as spot there
        used, total = demand.get((region, model_of[it]), (0, 0))
        new = pricing.spot_price(on_demand=current[(it, region, PriceKind.ON_DEMAND)],
                                 floor_fraction=floors.get((region, model_of[it]), settings.SPOT_FLOOR_FRACTION),
                                 allocated_milli=used, total_milli=total)
        if new != spot:
            changed.append(Price(instance_type_id=it, region_id=region, kind=PriceKind.SPOT, per_hour=new,
                                 currency=settings.BILLING_CURRENCY, effective_from=now, created_at=now))
            current[(it, region, kind)] = new
    with transaction.atomic():
        # Automatic moves are kept as price history, not audit events: they would drown the log.
        Price.objects.bulk_create(changed, ignore_conflicts=True)
        spot_max_price_preempt(now=now, prices={(it, r): p for (it, r, k), p in current.items()
                                                if k == PriceKind.SPOT})
    return len(changed)


def spot_max_price_preempt(*, now: datetime, prices: dict[tuple[int, int], Decimal]) -> int:
    """Give notice to spot work whose max price the spot price passed. Call inside atomic().

    The region's preemption notice, given as the scheduler gives it (scheduler.services
    .workloads_notice); the cycle turns an expired notice into PREEMPTED.
    """
    holding = (State.SCHEDULED, State.STARTING, State.RUNNING)
    pairs = set(Workload.objects.filter(billing=Billing.SPOT, max_price__isnull=False, state__in=holding,
                                        stop_by__isnull=True)
                .values_list("instance_type_id", "region_id").distinct())
    notice = dict(RegionSchedulerSettings.objects.values_list("region_id", "notice_s"))
    notices = []
    for it, region in pairs:
        price = prices.get((it, region))
        if price is None:
            continue
        notices += [Notice(workload_id=wid, notice_s=notice.get(region, 30),
                           cause=f"preempted: the spot price {price}/h passed your max price {max_price}/h")
                    for wid, max_price in Workload.objects.filter(
                        billing=Billing.SPOT, instance_type_id=it, region_id=region, state__in=holding,
                        stop_by__isnull=True, max_price__lt=price).values_list("id", "max_price")]
    return len(workloads_notice(notices=notices, now=now))


# ---------------------------------------------------------------- invoices


def invoice_refresh(*, tenant_id: Any, month: date) -> Invoice:
    """(Re)build a draft invoice for `month` from the usage entries. Issued invoices never change.

    One line per (instance type, region, kind, price): a mid-month price change gives two
    lines. Each line's amount is rounded once from its exact price-seconds.
    """
    start = month_start(month)
    end = next_month(start)
    with transaction.atomic():
        invoice, _ = Invoice.objects.get_or_create(
            tenant_id=tenant_id, period_start=start,
            defaults={"period_end": end, "currency": settings.BILLING_CURRENCY})
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.status != InvoiceStatus.DRAFT:
            return invoice
        rows = (
            LedgerEntry.objects.filter(tenant_id=tenant_id, kind=EntryKind.USAGE,
                                       period_start__gte=_midnight(start), period_start__lt=_midnight(end))
            .values("instance_type_id", "region_id", "price_kind", "per_hour",
                    "instance_type__gpu_count", "instance_type__gpu_share_milli")
            .annotate(seconds_sum=Sum("seconds"), ps=Sum("price_seconds"),
                      gms=Sum(F("gpu_milli") * F("seconds")))
            .order_by("instance_type_id", "region_id", "price_kind", "per_hour")
        )
        lines = [
            InvoiceLine(
                invoice=invoice, instance_type_id=r["instance_type_id"], region_id=r["region_id"],
                kind=r["price_kind"], per_hour=r["per_hour"],
                unit_price=pricing.per_gpu_hour(
                    per_hour=r["per_hour"],
                    gpu_milli=r["instance_type__gpu_count"] * r["instance_type__gpu_share_milli"]),
                seconds=r["seconds_sum"], gpu_hours=pricing.gpu_hours(gpu_milli_seconds=int(r["gms"])),
                price_seconds=r["ps"], amount=pricing.cents_of_price_seconds(r["ps"]),
            )
            for r in rows
        ]
        # volumes: one line per region and per GiB-hour price (per_hour is GiB × that price)
        storage: dict[tuple[int, Decimal], list] = {}
        for r in (LedgerEntry.objects.filter(tenant_id=tenant_id, kind=EntryKind.STORAGE,
                                             period_start__gte=_midnight(start), period_start__lt=_midnight(end))
                  .values_list("region_id", "per_hour", "gib", "seconds", "price_seconds")):
            region_id, per_hour, gib, seconds, ps = r
            acc = storage.setdefault((region_id, per_hour / gib), [0, 0, Decimal(0)])
            acc[0] += seconds
            acc[1] += gib * seconds
            acc[2] += ps
        lines += [
            InvoiceLine(invoice=invoice, instance_type=None, region_id=region_id, kind="storage",
                        per_hour=per_gib_hour, unit_price=per_gib_hour, seconds=secs, gpu_hours=Decimal(0),
                        gib_hours=(Decimal(gib_s) / 3600).quantize(Decimal("0.0001")), price_seconds=ps,
                        amount=pricing.cents_of_price_seconds(ps))
            for (region_id, per_gib_hour), (secs, gib_s, ps) in sorted(storage.items())
        ]
        InvoiceLine.objects.filter(invoice=invoice).delete()
        InvoiceLine.objects.bulk_create(lines)
        invoice.total = sum((line.amount for line in lines), Decimal("0.00"))
        invoice.save(update_fields=["total", "updated_at"])
        return invoice


def invoices_follow(*, posted_since: datetime) -> int:
    """Keep the draft invoices of the months that just got usage near the ledger: a tenant's
    month shows its draft (and its CSV) from its first metered minute, not from the next hourly
    `invoices_close`. Refreshes the draft of each (tenant, month) with entries posted since
    `posted_since` that has none yet or was refreshed over `INVOICE_DRAFT_REFRESH_S` ago: a
    refresh costs about eight statements a tenant, so refreshing every draft at every run
    tripled the run's statements with 200 tenants (docs/billing.md). An issued invoice never
    changes (`invoice_refresh`)."""
    months = set(LedgerEntry.objects.filter(kind__in=(EntryKind.USAGE, EntryKind.STORAGE),
                                            created_at__gte=posted_since)
                 .annotate(month=TruncMonth("period_start", tzinfo=UTC)).values_list("tenant_id", "month"))
    if not months:
        return 0
    fresh_since = timezone.now() - timedelta(seconds=settings.INVOICE_DRAFT_REFRESH_S)
    fresh = set(Invoice.objects.filter(tenant_id__in={t for t, _ in months},
                                       period_start__in={month_start(m) for _, m in months},
                                       updated_at__gte=fresh_since).values_list("tenant_id", "period_start"))
    due = sorted({(t, month_start(m)) for t, m in months} - fresh, key=lambda p: (str(p[0]), p[1]))
    for tenant_id, month in due:
        invoice_refresh(tenant_id=tenant_id, month=month)
    return len(due)


def metered_through(*, tenant_id: Any, at: datetime) -> bool:
    """Whether every running second of the tenant before `at` is posted."""
    cursor = MeteringCursor.objects.filter(name="default").values_list("events_until", flat=True).first()
    if cursor is None or cursor < at:
        return False
    return not Meter.objects.filter(tenant_id=tenant_id, done=False, metered_until__lt=at).exists()


def invoice_issue(*, invoice: Invoice, now: datetime | None = None) -> Invoice:
    """Close a month's invoice: rebuilt one last time, then `paid` when prepaid credit covers
    it (the balance is not negative), else `issued` and the payment provider is asked."""
    now = now or timezone.now()
    invoice = invoice_refresh(tenant_id=invoice.tenant_id, month=invoice.period_start)
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if invoice.status != InvoiceStatus.DRAFT:
            return invoice
        balance = account_for(tenant_id=invoice.tenant_id).balance
        invoice.issued_at = now
        if balance >= 0 or invoice.total == 0:
            invoice.status, invoice.paid_at, invoice.payment_reference = InvoiceStatus.PAID, now, "prepaid credit"
        else:
            invoice.status = InvoiceStatus.ISSUED
        invoice.save()
        audit_record(tenant=invoice.tenant, action="invoice.issue", obj=invoice,
                     data={"total": str(invoice.total), "status": invoice.status})
    if invoice.status == InvoiceStatus.ISSUED:
        invoice_collect(invoice=invoice, owed=min(invoice.total, pricing.cents(-balance)))
    return invoice


def invoice_collect(*, invoice: Invoice, owed: Decimal) -> bool:
    """Ask the payment provider for `owed` (outside any transaction); record what it collected."""
    result = get_provider().collect(tenant_id=str(invoice.tenant_id), invoice_id=str(invoice.pk),
                                    amount=owed, currency=invoice.currency)
    if not result.collected:
        logger.info("invoice=%s not collected: %s", invoice.pk, result.message)
        return False
    invoice_mark_paid(invoice=invoice, amount=owed, reference=result.reference)
    return True


@transaction.atomic
def invoice_mark_paid(*, invoice: Invoice, amount: Decimal, reference: str = "") -> Invoice:
    """A payment arrived for an issued invoice: credit it to the ledger and mark the invoice paid."""
    invoice = Invoice.objects.select_for_update().get(pk=invoice.pk)
    if invoice.status != InvoiceStatus.ISSUED:
        return invoice
    if amount > 0:
        _post(tenant_id=invoice.tenant_id, kind=EntryKind.PAYMENT, amount=amount,
              memo=f"payment for invoice {invoice.number} {reference}".strip())
    invoice.status, invoice.paid_at, invoice.payment_reference = InvoiceStatus.PAID, timezone.now(), reference[:200]
    invoice.save()
    audit_record(tenant=invoice.tenant, action="invoice.paid", obj=invoice, data={"amount": str(amount)})
    return invoice


def invoices_close(*, now: datetime | None = None) -> dict[str, int]:
    """Refresh this month's drafts; issue last month's once its usage is fully metered."""
    now = now or timezone.now()
    this_month = month_start(now)
    last_month = month_start(this_month - timedelta(days=1))
    counts = {"refreshed": 0, "issued": 0}
    for month in (last_month, this_month):
        start, end = _midnight(month), _midnight(next_month(month))
        tenants = set(LedgerEntry.objects.filter(kind__in=(EntryKind.USAGE, EntryKind.STORAGE),
                                                 period_start__gte=start,
                                                 period_start__lt=end).values_list("tenant_id", flat=True))
        tenants |= set(Invoice.objects.filter(period_start=month, status=InvoiceStatus.DRAFT)
                       .values_list("tenant_id", flat=True))
        for tenant_id in tenants:
            invoice = invoice_refresh(tenant_id=tenant_id, month=month)
            counts["refreshed"] += 1
            if month == last_month and invoice.status == InvoiceStatus.DRAFT and \
                    metered_through(tenant_id=tenant_id, at=end):
                invoice_issue(invoice=invoice, now=now)
                counts["issued"] += 1
    return counts


# ---------------------------------------------------------------- adding credit (top-ups)


def topup_request(*, tenant: Tenant, user: Any, amount: Decimal, success_url: str, cancel_url: str
                  ) -> tuple[TopUp, TopUpStart]:
    """A renter asks to add `amount` of credit: the `TopUp` row (audited), then the payment
    provider says what happens next (an operator approves it, or a checkout page to pay on).
    The provider is asked outside any transaction (it may go over the network); a failure
    leaves the request filed, unpaid."""
    amount = Decimal(amount).quantize(pricing.CENT)
    if not settings.BILLING_TOPUP_MIN <= amount <= settings.BILLING_TOPUP_MAX:
        raise InvalidInput(
            f"A top-up is between {settings.BILLING_TOPUP_MIN} and {settings.BILLING_TOPUP_MAX}.",
            fields={"amount": [f"Between {settings.BILLING_TOPUP_MIN} and {settings.BILLING_TOPUP_MAX}."]})
    provider = get_provider()
    with transaction.atomic():
        topup = TopUp.objects.create(tenant=tenant, amount=amount, currency=settings.BILLING_CURRENCY,
                                     provider=provider.name, requested_by=user)
        audit_record(tenant=tenant, action="billing.topup.request", obj=topup,
                     data={"amount": str(amount), "provider": provider.name})
    start = provider.topup_start(topup_id=str(topup.pk), amount=amount, currency=topup.currency,
                                 success_url=success_url, cancel_url=cancel_url)
    if start.reference:
        TopUp.objects.filter(pk=topup.pk).update(provider_ref=start.reference[:200])
    return topup, start


@transaction.atomic
def topup_credit(*, topup_id: Any, provider: str, event_id: str, amount: Decimal, currency: str,
                 operator: Any = None) -> bool:
    """Pay a requested top-up: one `payment` ledger entry, the row `paid`, audited. Exactly
    once: the row is locked and only a `requested` one pays (a replayed webhook, a second
    approval, two workers at once find it paid and change nothing), and the database refuses a
    second top-up paid by the same provider event. Returns whether it credited."""
    topup = TopUp.objects.select_for_update().filter(pk=topup_id).first()
    if topup is None:
        raise InvalidInput("No such top-up.", code="not_found")
    if topup.status != TopUpStatus.REQUESTED:
        return False
    if topup.provider != provider or currency.upper() != topup.currency.upper() or amount != topup.amount:
        # what was paid is not what was asked: nothing lands; an operator looks at it
        logger.error("topup=%s tenant=%s event=%s does not match the request (provider %s, %s %s)",
                     topup.pk, topup.tenant_id, event_id, provider, amount, currency)
        raise InvalidInput("The payment does not match the top-up.", code="topup_mismatch")
    entry = _post(tenant_id=topup.tenant_id, kind=EntryKind.PAYMENT, amount=topup.amount.quantize(pricing.MICRO),
                  memo=f"top-up {str(topup.pk)[:8]} ({provider} {event_id})")
    topup.status, topup.entry, topup.paid_event, topup.paid_at = TopUpStatus.PAID, entry, event_id, timezone.now()
    topup.decided_by = operator
    topup.save(update_fields=["status", "entry", "paid_event", "paid_at", "decided_by"])
    audit_record(tenant=topup.tenant, action="billing.topup.paid", obj=topup,
                 data={"amount": str(topup.amount), "provider": provider, "event": event_id})
    return True


def topup_approve(*, topup: TopUp, operator: Any) -> bool:
    """An operator approves a filed request (the default provider's top-ups): credited once,
    however often it is approved."""
    return topup_credit(topup_id=topup.pk, provider=topup.provider, event_id=f"approval:{topup.pk}",
                        amount=topup.amount, currency=topup.currency, operator=operator)


@transaction.atomic
def topup_reject(*, topup: TopUp, operator: Any) -> bool:
    """An operator declines a filed request: nothing is credited; a paid one stays paid."""
    changed = TopUp.objects.filter(pk=topup.pk, status=TopUpStatus.REQUESTED).update(
        status=TopUpStatus.REJECTED, decided_by=operator)
    if changed:
        audit_record(tenant=topup.tenant, action="billing.topup.reject", obj=topup, data={"amount": str(topup.amount)})
    return bool(changed)


def topup_webhook(*, payload: bytes, signature: str) -> bool:
    """A payment provider's webhook: verified by the provider (`InvalidEvent` when it does not
    verify, and nothing changes), then the top-up it pays is credited once. Returns whether it
    credited (False for events that pay nothing and for replays)."""
    provider = get_provider()
    verify = getattr(provider, "event_verify", None)
    if verify is None:
        raise InvalidEvent("this installation's payment provider takes no webhooks")
    paid = verify(payload=payload, signature=signature)
    if paid is None:
        return False
    try:
        return topup_credit(topup_id=paid.topup_id, provider=provider.name, event_id=paid.event_id,
                            amount=paid.amount, currency=paid.currency)
    except IntegrityError:  # the same event already paid a top-up (the database's word)
        return False
