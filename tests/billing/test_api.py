"""Billing through the API: 402s that create nothing, balance, usage, invoices, budgets, costs."""
from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import services
from billing.choices import EntryKind
from billing.models import Account, Budget, LedgerEntry
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload, WorkloadEvent
from scheduler.notice import notice_text
from tests.billing.helpers import at, make_run, set_price
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db

BODY = {"name": "nb", "instance_type": "h100.1x", "region": "us-east-1", "image": "pytorch/pytorch:2.4.0"}


def counts():
    return (Workload.objects.count(), WorkloadEvent.objects.count(), AuditEvent.objects.count(),
            LedgerEntry.objects.count())


def test_launch_at_zero_balance_answers_402_and_creates_nothing(alice, fleet):
    services.credit_grant(tenant=alice.tenant, amount=Decimal("-1000"), kind=EntryKind.ADJUSTMENT)
    before = counts()
    for url in ("/api/v1/instances", "/api/v1/jobs"):
        resp = alice.client().post(url, BODY, format="json")
        assert resp.status_code == 402, resp.json()
        error = resp.json()["error"]
        assert error["code"] == "insufficient_credit" and "add credit" in error["message"]
    assert counts() == before
    # credit again: it launches
    services.credit_grant(tenant=alice.tenant, amount=Decimal("5"))
    assert alice.client().post("/api/v1/instances", BODY, format="json").status_code == 201


def test_budget_hard_stop_refuses_launches_past_100_percent(alice, fleet):
    resp = alice.client().post("/api/v1/budgets", {"name": "cap", "monthly_amount": "2.00", "hard_stop": True,
                                                    "thresholds": [50, 100]}, format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["webhook_secret"].startswith("whsec_")
    assert "webhook_secret" not in alice.client().get(f"/api/v1/budgets/{resp.json()['id']}").json()
    from django.utils import timezone

    now = timezone.now()
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    set_price("h100.1x", "2.4900", since=start)
    make_run(alice, transitions=[(start, State.PENDING), (start, State.RUNNING)])
    services.metering_run(now=start + timedelta(hours=2))  # two hours of 2.49 posted this month
    assert services.month_spend(tenant_id=alice.tenant.pk, at=now) >= Decimal("2.49")
    before = counts()
    resp = alice.client().post("/api/v1/instances", BODY, format="json")
    assert resp.status_code == 402 and resp.json()["error"]["code"] == "budget_exceeded"
    assert counts() == before
    # the scheduler admits nothing new of this tenant either
    assert Account.objects.get(tenant=alice.tenant).budget_blocked
    from scheduler.snapshot import tenant_views

    assert [v.budget_exhausted for v in tenant_views({str(alice.tenant.pk)})] == [True]
    # raising the budget lifts the stop
    assert alice.client().patch(f"/api/v1/budgets/{resp_id(alice)}", {"monthly_amount": "100000"},
                                format="json").status_code == 200
    assert alice.client().post("/api/v1/instances", BODY, format="json").status_code == 201


def test_budget_changes_reach_the_scheduler_at_once(alice, catalog, fleet):
    """Regression: raising or deleting a spent hard-stop budget lifted the API's 402 at once but
    left the scheduler's flag set until the next metering run (and a new spent budget blocked
    the API only). Now both read one flag, kept by every budget change."""
    from django.utils import timezone

    from scheduler.snapshot import tenant_views

    start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    set_price("h100.1x", "2.4900", since=start)
    make_run(alice, transitions=[(start, State.PENDING), (start, State.RUNNING)])
    services.metering_run(now=start + timedelta(hours=2))  # 4.98 spent this month

    def scheduler_blocks():
        return [v.budget_exhausted for v in tenant_views({str(alice.tenant.pk)})] == [True]

    assert not scheduler_blocks()
    client = alice.client()
    # a budget created already spent: the API and the scheduler both refuse, without metering
    resp = client.post("/api/v1/budgets", {"name": "cap", "monthly_amount": "2.00", "hard_stop": True},
                       format="json")
    assert resp.status_code == 201
    assert scheduler_blocks()
    assert client.post("/api/v1/instances", BODY, format="json").json()["error"]["code"] == "budget_exceeded"
    # raised: both admit again
    assert client.patch(f"/api/v1/budgets/{resp_id(alice)}", {"monthly_amount": "100000"},
                        format="json").status_code == 200
    assert not scheduler_blocks()
    # lowered again, then deleted: blocked, then free
    assert client.patch(f"/api/v1/budgets/{resp_id(alice)}", {"monthly_amount": "3"},
                        format="json").status_code == 200
    assert scheduler_blocks()
    assert client.delete(f"/api/v1/budgets/{resp_id(alice)}").status_code == 204
    assert not scheduler_blocks()
    assert client.post("/api/v1/instances", BODY, format="json").status_code == 201


def resp_id(actor):
    return str(Budget.objects.get(tenant=actor.tenant).pk)


def test_viewers_read_billing_but_only_admins_manage_budgets(alice, victor, bob):
    assert victor.client().get("/api/v1/balance").json()["balance"] == "1000.00"
    assert victor.client().get("/api/v1/ledger").json()["results"][0]["kind"] == "signup_credit"
    for actor in (victor, bob):
        resp = actor.client().post("/api/v1/budgets", {"monthly_amount": "10"}, format="json")
        assert resp.status_code == 403
    assert not Budget.objects.exists()
    bad = alice.client().post("/api/v1/budgets", {"monthly_amount": "0", "thresholds": [0]}, format="json")
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"monthly_amount", "thresholds"}


def test_invoice_json_csv_and_html(alice, charlie, catalog):
    set_price("h100.8x", "19.9200")
    set_price("h100.8x", "17.9200", since=at(2025, 3, 15))
    make_run(alice, it="h100.8x", transitions=[(at(2025, 3, 14, 12), State.PENDING),
                                               (at(2025, 3, 14, 12), State.RUNNING),
                                               (at(2025, 3, 15, 12), State.STOPPING)])
    services.metering_run(now=at(2025, 4, 2))
    invoice = services.invoice_refresh(tenant_id=alice.tenant.pk, month=at(2025, 3, 1).date())
    listed = alice.client().get("/api/v1/invoices").json()["results"]
    assert [i["id"] for i in listed] == [str(invoice.pk)]
    body = alice.client().get(f"/api/v1/invoices/{invoice.pk}").json()
    assert [(ln["per_hour"], ln["gpu_hours"], ln["amount"]) for ln in body["lines"]] == [
        ("17.9200", "96.0000", "215.04"), ("19.9200", "96.0000", "239.04")]
    assert body["total"] == "454.08"
    resp = alice.client().get(f"/api/v1/invoices/{invoice.pk}", {"format": "csv"})
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(resp.content.decode())))
    assert rows[0][:3] == ["invoice", "period_start", "period_end"] and rows[-1][4] == "total"
    assert rows[-1][11] == "454.08"
    html = alice.client().get(f"/api/v1/invoices/{invoice.pk}", {"format": "html"})
    assert html.status_code == 200 and b"454.08" in html.content and b"h100.8x" in html.content
    # another tenant's invoice is absent, in every format, in the one error shape
    for fmt in ("json", "csv", "html"):
        resp = charlie.client().get(f"/api/v1/invoices/{invoice.pk}", {"format": fmt})
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_usage_grouped_by_type_region_day_and_instance(alice, catalog):
    set_price("h100.1x", "2.4900")
    set_price("l40s.quarter", "0.2723")
    a = make_run(alice, name="a", transitions=[(at(2025, 3, 1, 23), State.PENDING), (at(2025, 3, 1, 23), State.RUNNING),
                                               (at(2025, 3, 2, 1), State.STOPPING)])
    make_run(alice, name="b", it="l40s.quarter", transitions=[(at(2025, 3, 2), State.PENDING),
                                                               (at(2025, 3, 2), State.RUNNING),
                                                               (at(2025, 3, 2, 4), State.LOST)])
    services.metering_run(now=at(2025, 3, 3))
    q = {"from": "2025-03-01T00:00:00Z", "to": "2025-04-01T00:00:00Z"}
    by_type = alice.client().get("/api/v1/usage", {**q, "group_by": "instance_type"}).json()
    assert [(r["key"], r["gpu_hours"], r["amount"]) for r in by_type["rows"]] == [
        ("h100.1x", "2.0000", "4.98"), ("l40s.quarter", "1.0000", "1.09")]
    assert by_type["total"] == "6.07"
    by_day = alice.client().get("/api/v1/usage", {**q, "group_by": "day"}).json()
    assert [(r["key"], r["seconds"]) for r in by_day["rows"]] == [("2025-03-01", 3600), ("2025-03-02", 3600 + 14400)]
    by_instance = alice.client().get("/api/v1/usage", {**q, "group_by": "instance"}).json()
    assert {r["key"]: r["label"] for r in by_instance["rows"]}[str(a.pk)] == "a"
    assert alice.client().get("/api/v1/usage", {"group_by": "galaxy"}).status_code == 400


def test_instances_show_hourly_cost_and_cost_so_far_without_n_plus_1(alice, catalog):
    make_hosts(n=1)
    resp = alice.client().post("/api/v1/instances", {**BODY, "instance_type": "h100.8x"}, format="json")
    assert resp.status_code == 201
    assert resp.json()["hourly_cost"] == "19.9200" and resp.json()["cost_so_far"] == "0.00"
    for i in range(3):
        alice.client().post("/api/v1/instances", {**BODY, "name": f"n{i}"}, format="json")
    with CaptureQueriesContext(connection) as few:
        alice.client().get("/api/v1/instances")
    for i in range(6):
        alice.client().post("/api/v1/instances", {**BODY, "name": f"m{i}"}, format="json")
    with CaptureQueriesContext(connection) as many:
        body = alice.client().get("/api/v1/instances").json()
    assert len(many) == len(few)
    assert all(r["hourly_cost"] for r in body["results"])


def test_spot_max_price_is_checked_at_launch_and_preempts_when_passed(alice, catalog):
    make_hosts(n=1, gpus=8)
    spot = {**BODY, "billing": "spot"}
    assert alice.client().post("/api/v1/instances", {**BODY, "max_price": "1"}, format="json").status_code == 400
    low = alice.client().post("/api/v1/instances", {**spot, "max_price": "0.0100"}, format="json")
    assert low.status_code == 400 and low.json()["error"]["code"] == "max_price_below_spot"
    resp = alice.client().post("/api/v1/instances", {**spot, "max_price": "1.5000"}, format="json")
    assert resp.status_code == 201 and resp.json()["max_price"] == "1.5000"
    # fill the region's H100s: demand drives the spot price to on demand, past 1.50
    for i in range(7):
        alice.client().post("/api/v1/instances", {**BODY, "name": f"fill{i}"}, format="json")
    from gpucloud.catalogue.models import Region

    run_cycle(region_id=Region.objects.get(code="us-east-1").pk)
    assert services.spot_prices_update() > 0
    prices = alice.client().get("/api/v1/spot-prices", {"instance_type": "h100.1x", "region": "us-east-1"}).json()
    assert prices["results"][0]["per_hour"] == "2.4900"  # the newest: on demand, everything is taken
    assert len(prices["results"]) == 2  # ...and the seeded price stays as history
    w = Workload.objects.get(pk=resp.json()["id"])
    assert w.stop_by is not None and w.stop_cause == "preempted: the spot price 2.4900/h passed your max price 1.5000/h"
    assert alice.client().get(f"/api/v1/instances/{w.pk}").json()["reason"] == notice_text(w.stop_cause, w.stop_by)


INTERNAL_WEBHOOKS = ["http://127.0.0.1:8000/hook", "http://localhost:6379", "https://localhost:6379/",
                     "http://169.254.169.254/latest/meta-data/", "https://169.254.169.254/", "http://[::1]/",
                     "https://[::1]/", "https://10.0.0.1/", "https://[::ffff:127.0.0.1]/", "https://2130706433/",
                     "https://hooks.internal.test/", "https://user:pw@8.8.8.8/"]


@pytest.mark.parametrize("url", INTERNAL_WEBHOOKS)
def test_a_webhook_to_an_internal_address_is_refused_and_saves_nothing(url, alice, catalog, monkeypatch):
    from gpucloud.lib import outbound

    real = outbound.resolve
    # a stand-in for DNS: this one name resolves to loopback, the rest as the system says
    monkeypatch.setattr(outbound, "resolve", lambda host, port: (["127.0.0.1"] if host == "hooks.internal.test"
                                                                 else real(host, port)))
    resp = alice.client().post("/api/v1/budgets", {"name": "b", "monthly_amount": "10", "webhook_url": url},
                               format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["error"]["code"] == "validation_error"
    assert list(resp.json()["error"]["fields"]) == ["webhook_url"]
    assert not Budget.objects.exists()
    # nor can an existing budget be pointed there
    budget = services.budget_create(tenant=alice.tenant, name="b", monthly_amount=Decimal("10"))
    resp = alice.client().patch(f"/api/v1/budgets/{budget.pk}", {"webhook_url": url}, format="json")
    assert resp.status_code == 400 and "webhook_url" in resp.json()["error"]["fields"]
    budget.refresh_from_db()
    assert budget.webhook_url == ""


def test_a_webhook_to_a_public_https_address_is_saved(alice, catalog):
    resp = alice.client().post("/api/v1/budgets", {"name": "b", "monthly_amount": "10",
                                                    "webhook_url": "https://8.8.8.8/hooks/gpucloud"}, format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["webhook_url"] == "https://8.8.8.8/hooks/gpucloud"

