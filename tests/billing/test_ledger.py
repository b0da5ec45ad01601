"""Metering into the ledger: exact, idempotent, crash-safe in-process; balances, invoices."""
from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import Sum

from billing import metering, pricing, services
from billing.choices import EntryKind, InvoiceStatus
from billing.models import Account, Invoice, LedgerEntry, Meter
from gpucloud.tenancy.models import Tenant
from scheduler.choices import State
from scheduler.snapshot import tenant_views
from tests.billing.helpers import at, make_run, make_volume, set_price, set_storage_price
from tests.conftest import make_actor

pytestmark = pytest.mark.django_db

R, S, P = State.RUNNING, State.STOPPING, State.STOPPED


def balance_is_sum_of_entries(tenant) -> bool:
    total = LedgerEntry.objects.filter(tenant=tenant).aggregate(s=Sum("amount"))["s"]
    return Account.objects.get(tenant=tenant).balance == total


def test_new_tenants_get_the_signup_credit(alice, settings):
    entry = LedgerEntry.objects.get(tenant=alice.tenant)
    assert entry.kind == EntryKind.SIGNUP_CREDIT and entry.amount == Decimal("1000")
    assert Account.objects.get(tenant=alice.tenant).balance == Decimal("1000")


def test_running_seconds_are_posted_per_second_at_the_price_in_force(alice, catalog):
    set_price("h100.1x", "2.4900")
    w = make_run(alice, transitions=[(at(2025, 3, 1, 10, 0, 0, 500), State.PENDING),
                                     (at(2025, 3, 1, 10, 0, 5), State.SCHEDULED),
                                     (at(2025, 3, 1, 10, 0, 9, 900_000), R),  # counts from 10:00:09
                                     (at(2025, 3, 1, 10, 30, 9, 100), S),  # …until 10:30:09
                                     (at(2025, 3, 1, 10, 30, 20), P)])
    stats = services.metering_run(now=at(2025, 3, 1, 12, 0, 0))
    usage = LedgerEntry.objects.filter(workload=w)
    assert sum(e.seconds for e in usage) == 1800
    assert usage.aggregate(s=Sum("amount"))["s"] == Decimal("-1.245")  # 2.49 / 2, rounded once
    assert stats.entries == 1 and Meter.objects.get(pk=w.pk).done
    assert balance_is_sum_of_entries(alice.tenant)
    # a second run changes nothing
    again = services.metering_run(now=at(2025, 3, 1, 12, 0, 0))
    later = services.metering_run(now=at(2025, 3, 2, 12, 0, 0))
    assert again.entries == later.entries == 0
    assert LedgerEntry.objects.filter(workload=w).count() == 1


def test_a_still_running_instance_is_posted_in_closed_windows(alice, catalog, settings):
    settings.METERING_SETTLE_S = 30
    set_price("l40s.quarter", "0.2723")
    w = make_run(alice, it="l40s.quarter", transitions=[(at(2025, 3, 1, 9, 59, 0), State.PENDING),
                                                        (at(2025, 3, 1, 10, 0, 0), R)])
    for minute in range(1, 6):
        services.metering_run(now=at(2025, 3, 1, 10, minute, 40))  # cutoff: 10:0{minute}:00
    entries = LedgerEntry.objects.filter(workload=w).order_by("period_start")
    assert [e.seconds for e in entries] == [60] * 5
    assert Meter.objects.get(pk=w.pk).metered_until == at(2025, 3, 1, 10, 5)
    # five minutes of a quarter L40S: rounded once overall, not once per minute
    assert -sum(e.amount for e in entries) == pricing.micro_of_price_seconds(Decimal("0.2723") * 300)
    assert entries[0].gpu_milli == 250


def test_a_crash_inside_the_run_loses_and_doubles_nothing(alice, charlie, catalog, monkeypatch, settings):
    """Crash the run at random points (an exception inside a chunk's transaction), run again.
    A meter per chunk, so that a run has a transaction per workload to crash between
    (tests/billing/test_crash.py kills runs of bigger chunks)."""
    settings.METERING_CHUNK = 1
    set_price("h100.1x", "2.4900")
    set_price("h100.1x", "2.9900", since=at(2025, 3, 1, 11, 0, 0, 300_000))
    rng = random.Random(7)
    workloads = []
    for i in range(12):
        t = at(2025, 3, 1, 10, 0) + timedelta(seconds=rng.randint(0, 3600))
        steps = [(t, State.PENDING)]
        for _ in range(rng.randint(1, 3)):
            t += timedelta(seconds=rng.randint(1, 900), microseconds=rng.randint(0, 999_999))
            steps.append((t, R))
            t += timedelta(seconds=rng.randint(0, 2400))
            end = rng.choice([State.PREEMPTED, State.LOST, None])
            if end is None:
                break
            steps.append((t, end))
            t += timedelta(seconds=1)
            steps.append((t, State.PENDING))
        workloads.append(make_run(rng.choice([alice, charlie]), transitions=steps, name=f"w{i}"))
    now = at(2025, 3, 1, 14, 0, 0)
    real = LedgerEntry.objects.bulk_create
    crashes = 0
    for _attempt in range(20):
        left = [rng.randint(0, 3)]

        def crashing(objs, *a, left=left, **kw):
            if left[0] == 0:
                raise RuntimeError("killed")
            left[0] -= 1
            return real(objs, *a, **kw)

        monkeypatch.setattr(LedgerEntry.objects, "bulk_create", crashing)
        try:
            services.metering_run(now=now)
        except RuntimeError:
            crashes += 1
        else:
            break
    assert crashes >= 3
    monkeypatch.setattr(LedgerEntry.objects, "bulk_create", real)
    services.metering_run(now=now)
    services.metering_run(now=now)
    cutoff = metering.epoch_floor(services.metering_cutoff(now))
    for w in workloads:
        events = [(metering.epoch_floor(e.created_at), e.to_state) for e in w.events.order_by("created_at", "id")]
        prices = [(metering.epoch_ceil(p.effective_from), p.per_hour) for p in
                  w.instance_type.prices.filter(region=w.region, kind="on_demand").order_by("effective_from")]
        parts = metering.slices(events=events, prices=prices, start=metering.epoch_floor(w.created_at), end=cutoff)
        posted = LedgerEntry.objects.filter(workload=w)
        assert sum(e.seconds for e in posted) == metering.running_seconds(events, start=0, end=cutoff)
        exact = sum((p.price_seconds() for p in parts), Decimal(0))
        assert -sum((e.amount for e in posted), Decimal(0)) == pricing.micro_of_price_seconds(exact)
    assert balance_is_sum_of_entries(alice.tenant) and balance_is_sum_of_entries(charlie.tenant)


def test_an_invoice_with_a_mid_month_price_change_has_a_line_per_price(alice, catalog):
    set_price("h100.8x", "19.9200")
    set_price("h100.8x", "17.9200", since=at(2025, 3, 15))
    set_price("l40s.quarter", "0.2723")
    make_run(alice, it="h100.8x", transitions=[(at(2025, 3, 10), State.PENDING), (at(2025, 3, 10), R),
                                               (at(2025, 3, 20), S), (at(2025, 3, 20, 0, 1), P)])
    make_run(alice, it="l40s.quarter", transitions=[(at(2025, 3, 31, 22), State.PENDING),
                                                    (at(2025, 3, 31, 23), R)])  # runs into April
    services.metering_run(now=at(2025, 4, 1, 1, 0))
    invoice = services.invoice_refresh(tenant_id=alice.tenant.pk, month=at(2025, 3, 1).date())
    lines = {(ln.instance_type.code, ln.per_hour): ln for ln in invoice.lines.select_related("instance_type")}
    assert set(lines) == {("h100.8x", Decimal("19.9200")), ("h100.8x", Decimal("17.9200")),
                          ("l40s.quarter", Decimal("0.2723"))}
    old, new = lines[("h100.8x", Decimal("19.9200"))], lines[("h100.8x", Decimal("17.9200"))]
    assert old.gpu_hours == new.gpu_hours == Decimal("960")  # 5 days × 24 h × 8 GPUs
    assert (old.unit_price, old.amount) == (Decimal("2.49"), Decimal("2390.40"))
    assert (new.unit_price, new.amount) == (Decimal("2.24"), Decimal("2150.40"))
    quarter = lines[("l40s.quarter", Decimal("0.2723"))]
    assert quarter.gpu_hours == Decimal("0.25") and quarter.amount == Decimal("0.27")  # one hour in March
    assert invoice.total == Decimal("2390.40") + Decimal("2150.40") + Decimal("0.27")
    assert invoice.status == InvoiceStatus.DRAFT
    # April is not closed yet: the month is issued once it is fully metered
    counts = services.invoices_close(now=at(2025, 4, 1, 1, 0))
    assert counts["issued"] == 1
    invoice.refresh_from_db()
    # 4,540.80 used against 1,000 of credit: owed, and the default provider collects nothing
    assert invoice.status == InvoiceStatus.ISSUED and invoice.issued_at
    assert Invoice.objects.get(tenant=alice.tenant, period_start=at(2025, 4, 1).date()).status == "draft"
    services.invoice_mark_paid(invoice=invoice, amount=invoice.total, reference="wire 42")
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID
    assert LedgerEntry.objects.filter(tenant=alice.tenant, kind="payment").get().amount == invoice.total
    assert balance_is_sum_of_entries(alice.tenant)


def test_zero_balance_stops_spot_at_once_and_on_demand_after_the_grace(alice, catalog, settings):
    settings.BILLING_GRACE_S = 3600
    set_price("h100.1x", "2.4900")
    set_price("h100.1x", "1.0000", kind="spot")
    od = make_run(alice, transitions=[(at(2025, 3, 1), State.PENDING), (at(2025, 3, 1), R)], name="od")
    spot = make_run(alice, billing="spot", transitions=[(at(2025, 3, 1), State.PENDING), (at(2025, 3, 1), R)],
                    name="spot")
    services.credit_grant(tenant=alice.tenant, amount=Decimal("-990"), kind=EntryKind.ADJUSTMENT)  # 10 left
    services.metering_run(now=at(2025, 3, 1, 3, 0, 30))  # 3 h: 7.47 + 3 = 10.47 > 10
    od.refresh_from_db(), spot.refresh_from_db()
    assert spot.state == State.STOPPING and od.state == State.RUNNING
    account = Account.objects.get(tenant=alice.tenant)
    assert account.balance < 0 and account.exhausted_since is not None
    # the grace is measured from when the balance reached zero
    services.balances_enforce(now=account.exhausted_since + timedelta(seconds=3601))
    od.refresh_from_db()
    assert od.state == State.STOPPING and "balance" in od.reason


@pytest.mark.parametrize("what", ["workload", "volume"])
def test_metering_that_spends_the_balance_blocks_launches_at_once(alice, catalog, what):
    """Regression: metering moved balances without pushing the verdict down, so a tenant metered
    to zero kept launching (the API and the scheduler read `Tenant.launch_blocked`) until another
    posting happened to refresh the flag. Every posting now goes through `ledger_post`."""
    if what == "workload":
        set_price("h100.1x", "2.4900")
        make_run(alice, transitions=[(at(2025, 3, 1), State.PENDING), (at(2025, 3, 1), R)])
    else:
        set_storage_price("0.0200")
        make_volume(alice, sizes=[(at(2025, 3, 1), 100)])
    services.credit_grant(tenant=alice.tenant, amount=Decimal("-995"), kind=EntryKind.ADJUSTMENT)  # 5 left
    alice.tenant.refresh_from_db()
    assert not alice.tenant.launch_blocked
    services.metering_run(now=at(2025, 3, 1, 3, 0, 30))  # 3 h: 7.47 (the workload) or 6.00 (the volume)
    alice.tenant.refresh_from_db()
    assert Account.objects.get(tenant=alice.tenant).balance <= 0
    assert (alice.tenant.launch_blocked, alice.tenant.launch_blocked_reason) == (True, "insufficient_credit")
    assert [v.budget_exhausted for v in tenant_views({str(alice.tenant.pk)})] == [True]
    assert balance_is_sum_of_entries(alice.tenant)


def test_one_chunk_of_many_tenants_posts_as_a_run_per_workload_did(alice, charlie, catalog, settings):
    """A chunk holds several tenants' meters: each tenant's entries, balance and launch verdict
    come out as they did when every workload was its own transaction (chunks of one, rolled back)."""
    dora = make_actor("dora@chunks.test", tenant_name="Dora")
    set_price("h100.1x", "2.4900")
    set_price("h100.1x", "2.9900", since=at(2025, 3, 1, 1, 0, 0, 500_000))
    services.credit_grant(tenant=charlie.tenant, amount=Decimal("-995"), kind=EntryKind.ADJUSTMENT)  # 5 left
    actors = (alice, charlie, dora)
    runs = [make_run(actor, name=f"w{i}", transitions=[(at(2025, 3, 1, 0, 0, i), State.PENDING),
                                                       (at(2025, 3, 1, 0, 1, i, 250_000), R),
                                                       (at(2025, 3, 1, 2, i, 7), S)])
            for i in range(3) for actor in actors]

    def outcome() -> tuple:
        services.metering_run(now=at(2025, 3, 1, 3, 0, 30))
        services.metering_run(now=at(2025, 3, 1, 3, 0, 30))  # idempotent: nothing twice
        assert all(balance_is_sum_of_entries(actor.tenant) for actor in actors)
        return (sorted((str(w.tenant_id), w.name, e.period_start, e.seconds, e.price_seconds, e.amount)
                       for w in runs for e in LedgerEntry.objects.filter(workload=w)),
                {a.tenant_id: a.balance for a in Account.objects.all()},
                {t.pk: (t.launch_blocked, t.launch_blocked_reason) for t in Tenant.objects.all()})

    settings.METERING_CHUNK = 1
    with transaction.atomic():
        one_each = outcome()
        transaction.set_rollback(True)
    settings.METERING_CHUNK = 500
    chunked = outcome()
    assert one_each == chunked and len(chunked[0]) == 18  # 9 workloads, each across the price change
    assert chunked[2][charlie.tenant.pk] == (True, "insufficient_credit")
    assert chunked[2][alice.tenant.pk] == chunked[2][dora.tenant.pk] == (False, "")
