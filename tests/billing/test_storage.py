"""Volumes on the ledger: GiB-seconds at the size and storage price of each second, exactly
once however the metering windows fall, and a storage line on the month's invoice."""
from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from billing import metering, pricing, services
from billing.choices import EntryKind
from billing.models import Account, LedgerEntry
from tests.billing.helpers import at, make_volume, set_storage_price, volume_exact

pytestmark = pytest.mark.django_db


def test_volumes_are_billed_per_gib_second_exactly_once_across_windows(alice, catalog):
    set_storage_price("0.0001")
    set_storage_price("0.0003", since=at(2025, 3, 1, 23, 59, 30, 500_000))  # a change near midnight
    grown = make_volume(alice, name="grown", sizes=[(at(2025, 3, 1, 22, 0, 7, 800_000), 10),
                                                    (at(2025, 3, 2, 0, 30, 0, 100_000), 25)])
    gone = make_volume(alice, name="gone", sizes=[(at(2025, 3, 1, 23, 0, 0), 3)],
                       deleted=at(2025, 3, 2, 0, 10, 5, 900_000))
    balance = Account.objects.get(tenant=alice.tenant).balance
    now = at(2025, 3, 2, 1, 0, 0)
    t = at(2025, 3, 1, 22, 0, 0)
    while t < now:  # windows of odd lengths, each run twice
        t += timedelta(seconds=1301)
        services.metering_run(now=min(t, now))
        services.metering_run(now=min(t, now))
    end = metering.epoch_floor(services.metering_cutoff(now))
    for v in (grown, gone):
        gib_s, exact = volume_exact(v, end=end)
        posted = LedgerEntry.objects.filter(volume=v, kind=EntryKind.STORAGE)
        assert sum(e.gib * e.seconds for e in posted) == gib_s, v.name
        assert -posted.aggregate(s=Sum("amount"))["s"] == pricing.micro_of_price_seconds(exact), v.name
        assert posted.count() == posted.values("period_start").distinct().count()  # no slice twice
    assert gone.meter.done and not grown.meter.done  # the deleted one stops at its deletion
    spent = -LedgerEntry.objects.filter(tenant=alice.tenant, kind=EntryKind.STORAGE).aggregate(s=Sum("amount"))["s"]
    assert Account.objects.get(tenant=alice.tenant).balance == balance - spent
    invoice = services.invoice_refresh(tenant_id=alice.tenant.pk, month=date(2025, 3, 1))
    lines = {(line.kind, line.per_hour): line for line in invoice.lines.all()}
    assert set(lines) == {("storage", Decimal("0.0001")), ("storage", Decimal("0.0003"))}
    march = [e for e in LedgerEntry.objects.filter(kind=EntryKind.STORAGE, period_start__lt=at(2025, 4, 1))]
    gib_hours = float(sum(line.gib_hours for line in lines.values()))
    assert abs(gib_hours - sum(e.gib * e.seconds for e in march) / 3600) < 0.001
    r = alice.client().get(f"/api/v1/invoices/{invoice.pk}")
    assert {line["instance_type"] for line in r.json()["lines"]} == {None}
    assert "Volumes" in alice.client().get(f"/api/v1/invoices/{invoice.pk}?format=html").content.decode()
