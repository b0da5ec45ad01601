"""Budget alerts: once per threshold and month, by email and a signed webhook, after commit."""
from __future__ import annotations

import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core import mail

from billing import alerts, notify, services
from billing.models import Budget, BudgetAlert
from gpucloud.celery import app
from gpucloud.lib import outbound
from scheduler.choices import State
from tests.billing.helpers import at, make_run, set_price

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    """A tiny webhook receiver on 127.0.0.1 that records what it got."""
    got: list[tuple[dict, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append(({**self.headers, "path": self.path}, body))
            if self.path == "/redirect":  # somewhere the sender must not be led
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            else:
                self.send_response(204)
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", got
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def allow_private(settings):
    """WEBHOOK_ALLOW_PRIVATE=1, as a demo sets it: the receiver lives on 127.0.0.1 over http."""
    settings.WEBHOOK_ALLOW_PRIVATE = True


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setattr(app.conf, "task_always_eager", True)


def test_thresholds_alert_once_by_email_and_signed_webhook_after_commit(alice, bob, catalog, receiver, eager,
                                                                        allow_private,
                                                                        django_capture_on_commit_callbacks):
    url, got = receiver
    budget = services.budget_create(tenant=alice.tenant, name="team", monthly_amount=Decimal("10.00"),
                                    thresholds=[50, 80, 100], webhook_url=url)
    set_price("h100.1x", "2.4900")
    make_run(alice, transitions=[(at(2025, 3, 1), State.PENDING), (at(2025, 3, 1), State.RUNNING)])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        services.metering_run(now=at(2025, 3, 1, 3, 0, 30))  # 3 h: 7.47 = 74.7 %
    assert got == [] and mail.outbox == []  # nothing leaves inside the transaction
    for callback in callbacks:
        callback()
    assert [a.threshold for a in BudgetAlert.objects.order_by("threshold")] == [50]
    (headers, body), = got
    payload = json.loads(body)
    assert payload["threshold"] == 50 and payload["spend"] == "7.47" and payload["budget"] == str(budget.pk)
    assert notify.verify(secret=budget.webhook_secret, header=headers[notify.SIGNATURE_HEADER], body=body)
    assert not notify.verify(secret="whsec_wrong", header=headers[notify.SIGNATURE_HEADER], body=body)
    assert mail.outbox[0].to == ["alice@acme.test"]  # owners and admins, not members
    # two more hours cross 80 and 100 % — each alerted once, even when the run repeats
    with django_capture_on_commit_callbacks(execute=True):
        services.metering_run(now=at(2025, 3, 1, 5, 0, 30))
        services.metering_run(now=at(2025, 3, 1, 5, 0, 30))
    assert sorted(json.loads(b)["threshold"] for _, b in got) == [50, 80, 100]
    assert len(mail.outbox) == 3
    assert all(a.webhook_delivered_at and a.email_sent_at for a in BudgetAlert.objects.all())


def test_a_failing_webhook_is_recorded_and_retried(alice, catalog, allow_private):
    budget = services.budget_create(tenant=alice.tenant, monthly_amount=Decimal("1"), thresholds=[1],
                                    webhook_url="http://127.0.0.1:9/nothing-listens", notify_email=False)
    alert = BudgetAlert.objects.create(budget=budget, month=at(2025, 3, 1).date(), threshold=1, spend=Decimal("1"))
    with pytest.raises(notify.DeliveryError):
        alerts.budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert alert.webhook_attempts == 1 and alert.last_error and alert.webhook_delivered_at is None


def _alert(budget):
    return BudgetAlert.objects.create(budget=budget, month=at(2025, 3, 1).date(), threshold=1, spend=Decimal("1"))


def test_a_url_refused_at_delivery_is_recorded_and_never_sent(alice, catalog, receiver, settings):
    url, got = receiver
    settings.WEBHOOK_ALLOW_PRIVATE = True  # saved while the operator allowed private addresses
    resp = alice.client().post("/api/v1/budgets", {"name": "b", "monthly_amount": "1", "notify_email": False,
                                                    "webhook_url": url}, format="json")
    assert resp.status_code == 201, resp.json()
    settings.WEBHOOK_ALLOW_PRIVATE = False  # ...and no longer
    alert = _alert(Budget.objects.get(pk=resp.json()["id"]))
    alerts.budget_alert_deliver(alert_id=alert.pk)  # no DeliveryError: a retry would be refused too
    alert.refresh_from_db()
    assert got == []
    assert alert.webhook_delivered_at is None and alert.webhook_attempts == 1
    assert alert.last_error == "refused: The URL must use https."


def test_a_name_that_resolves_elsewhere_at_delivery_is_refused(alice, catalog, receiver, monkeypatch):
    """DNS rebinding: public when saved, loopback when the worker sends. The guard's resolver is
    replaced by a stand-in for DNS; the receiver on 127.0.0.1 would get the request if the guard
    did not check again at delivery."""
    url, got = receiver
    port = url.split(":")[2].split("/")[0]
    monkeypatch.setattr(outbound, "resolve", lambda host, p: ["93.184.215.14"])
    resp = alice.client().post("/api/v1/budgets", {"name": "b", "monthly_amount": "1", "notify_email": False,
                                                    "webhook_url": f"https://hooks.example.test:{port}/hook"},
                               format="json")
    assert resp.status_code == 201, resp.json()
    monkeypatch.setattr(outbound, "resolve", lambda host, p: ["127.0.0.1"])
    alert = _alert(Budget.objects.get(pk=resp.json()["id"]))
    alerts.budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert got == [] and alert.webhook_delivered_at is None
    assert "hooks.example.test resolves to 127.0.0.1" in alert.last_error


def test_a_webhook_redirect_is_not_followed(alice, catalog, receiver, allow_private):
    url, got = receiver
    budget = services.budget_create(tenant=alice.tenant, monthly_amount=Decimal("1"), thresholds=[1],
                                    webhook_url=url.replace("/hook", "/redirect"), notify_email=False)
    alert = _alert(budget)
    with pytest.raises(notify.DeliveryError, match="302"):
        alerts.budget_alert_deliver(alert_id=alert.pk)
    assert [h["path"] for h, _ in got] == ["/redirect"]  # /elsewhere got nothing
    alert.refresh_from_db()
    assert alert.webhook_delivered_at is None and "redirects are not followed" in alert.last_error
