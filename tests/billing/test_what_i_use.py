"""What a renter uses and what it costs, in sight (issue 28, deliverable 5): the draft invoice
from the first metered minute, storage prices and cost on the volume and usage pages and in
the API, the instance page's volumes and idle auto-stop, GPU shares worded as fractions."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing import services
from billing.choices import InvoiceStatus
from billing.models import Invoice
from gpucloud.catalogue.choices import gpu_share_text
from gpucloud.catalogue.models import Price
from scheduler.choices import State
from scheduler.models import Workload
from tests.billing.helpers import make_run, make_volume, set_price, set_storage_price

pytestmark = pytest.mark.django_db


def console(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


def test_the_months_draft_invoice_and_its_csv_appear_with_the_first_metered_minute(alice, charlie, catalog):
    now = timezone.now().replace(microsecond=0)
    Price.objects.filter(instance_type__code="h100.1x").delete()
    set_price("h100.1x", "3.6000", since=now - timedelta(hours=1))
    make_run(alice, transitions=[(now - timedelta(minutes=3), State.PENDING),
                                 (now - timedelta(minutes=2, seconds=30), State.RUNNING)])
    assert not Invoice.objects.filter(tenant=alice.tenant).exists()
    services.metering_run(now=now)  # one minute's run, not the hourly invoices task
    invoice = Invoice.objects.get(tenant=alice.tenant)
    assert invoice.status == InvoiceStatus.DRAFT and invoice.total > 0
    [line] = invoice.lines.all()
    assert line.instance_type.code == "h100.1x" and line.seconds >= 60
    page = console(alice).get("/console/usage/")
    assert invoice.number in page.content.decode()
    csv = console(alice).get(f"/console/invoices/{invoice.pk}/csv")
    assert csv.status_code == 200 and "h100.1x" in csv.content.decode()
    assert not Invoice.objects.filter(tenant=charlie.tenant).exists()  # no usage, no invoice
    # later runs move the same draft on (one invoice a month, its total growing), at most every
    # INVOICE_DRAFT_REFRESH_S: a run right after changes nothing, one after that refreshes it
    services.metering_run(now=now + timedelta(minutes=1))
    assert Invoice.objects.get(tenant=alice.tenant).total == invoice.total
    Invoice.objects.filter(pk=invoice.pk).update(updated_at=timezone.now() - timedelta(seconds=301))
    services.metering_run(now=now + timedelta(minutes=2))
    later = Invoice.objects.get(tenant=alice.tenant)
    assert later.pk == invoice.pk and later.total > invoice.total


def test_storage_prices_and_cost_show_on_volume_pages_usage_page_and_api(alice, charlie, catalog):
    now = timezone.now().replace(microsecond=0)
    set_storage_price("0.0100", since=now - timedelta(days=1))
    v = make_volume(alice, sizes=[(now - timedelta(hours=2), 50)], name="datasets")
    services.metering_run(now=now - timedelta(hours=1))  # about the first hour posted (50 GiB × 0.01 = 0.50)
    usage = alice.client().get("/api/v1/usage").json()
    storage = usage["storage"]
    assert Decimal(storage["gib_hours"]) >= 49 and Decimal(storage["amount"]) >= Decimal("0.49")
    assert Decimal(usage["total"]) == sum(Decimal(r["amount"]) for r in usage["rows"]) + Decimal(storage["amount"])
    assert charlie.client().get("/api/v1/usage").json()["storage"]["amount"] == "0.00"  # tenants see their own
    # posted plus what metering has not posted yet: two hours of 50 GiB at 0.01
    detail = console(alice).get(f"/console/volumes/{v.pk}/").content.decode()
    assert "0.0100 per GiB-hour" in detail and ">1.00<" in detail.replace(" ", "")
    listing = console(alice).get("/console/volumes/").content.decode()
    assert "0.0100" in listing and "1.00" in listing
    page = console(alice).get("/console/usage/").content.decode()
    assert 'id="storage-amount"' in page and "datasets" in page and "0.0100" in page


def test_the_instance_page_shows_its_volumes_auto_stop_and_a_share_as_a_fraction(alice, catalog):
    from scheduler.cycle import run_cycle
    from scheduler.services import WorkloadSpec, workload_launch
    from tests.scheduler.fleet import make_hosts
    from volumes.services import volume_create

    make_hosts(n=1, model="L40S")
    volume = volume_create(tenant=alice.tenant, name="checkpoints", region="us-east-1", size_gib=20)
    w = workload_launch(tenant=alice.tenant, user=alice.user, spec=WorkloadSpec(
        kind="instance", name="nb", instance_type="l40s.eighth", region="us-east-1", image="busybox",
        auto_stop_idle_minutes=30, volumes=[{"volume": volume.pk, "mount_path": "/ckpt"}]))
    run_cycle(region_id=w.region_id)
    page = console(alice).get(f"/console/instances/{w.pk}/").content.decode()
    assert "checkpoints" in page and "/ckpt" in page
    assert "after 30 min with every GPU under 5 % utilisation" in page
    assert "(1/8 GPU)" in page and "‰" not in page
    assert "L40S (1/8 GPU)" in console(alice).get("/console/catalogue/").content.decode()
    Workload.objects.filter(pk=w.pk).update(auto_stop_idle_minutes=None)
    assert ">off<" in console(alice).get(f"/console/instances/{w.pk}/live").content.decode()


@pytest.mark.parametrize("milli, text", [(125, "1/8 GPU"), (250, "1/4 GPU"), (500, "1/2 GPU"), (1000, "1 GPU"),
                                         (8000, "8 GPUs"), (2500, "2 1/2 GPUs")])
def test_gpu_amounts_read_as_fractions(milli, text):
    assert gpu_share_text(milli) == text
