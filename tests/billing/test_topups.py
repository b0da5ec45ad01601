"""Adding credit (issue 28, deliverable 6): a top-up through the payment provider lands on the
ledger exactly once per payment, audited. The default provider files a request an operator
approves in the admin; Stripe Checkout opens a session (on a local stand-in for Stripe's API,
which this machine cannot reach) and pays on its signed webhook, verified with Stripe's
documented scheme (`Stripe-Signature: t=…,v1=…`, HMAC-SHA256 of "t.payload")."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from django.test import Client
from django.urls import reverse

from billing.choices import EntryKind, TopUpStatus
from billing.models import Account, LedgerEntry, TopUp
from gpucloud.tenancy.models import AuditEvent

pytestmark = pytest.mark.django_db

RECORDED = Path(__file__).parent / "recorded" / "checkout_session_completed.json"
SECRET = "whsec_test_5f1c2a9e7b3d4c6a8e0f2b4d6c8a0e2f"
STRIPE = "billing.payments.StripeCheckoutProvider"


def console(actor) -> Client:
    client = Client()
    client.force_login(actor.user)
    return client


def balance(actor) -> Decimal:
    return Account.objects.get(tenant=actor.tenant).balance


def payments(actor) -> int:
    return LedgerEntry.objects.filter(tenant=actor.tenant, kind=EntryKind.PAYMENT).count()


def test_a_request_waits_for_an_operator_and_approving_it_twice_credits_once(alice, bob, admin_client):
    before = balance(alice)
    resp = console(alice).post(reverse("console:topup_create"), {"amount": "25.00"})
    assert resp.status_code == 302
    topup = TopUp.objects.get(tenant=alice.tenant)
    assert topup.status == TopUpStatus.REQUESTED and topup.provider == "none" and topup.amount == Decimal("25.00")
    assert balance(alice) == before  # nothing until an operator approves
    page = console(alice).get(reverse("console:usage")).content.decode()
    assert "an operator approves it" in page
    url = reverse("admin:billing_topup_changelist")
    for _ in range(2):  # approving twice (or two operators at once) credits once
        assert admin_client.post(url, {"action": "approve", "_selected_action": [str(topup.pk)]},
                                 follow=True).status_code == 200
    assert balance(alice) == before + 25 and payments(alice) == 1
    topup.refresh_from_db()
    assert topup.status == TopUpStatus.PAID and topup.entry.amount == Decimal("25.000000")
    assert topup.decided_by.is_staff
    assert AuditEvent.objects.filter(tenant=alice.tenant, action="billing.topup.paid").count() == 1
    assert AuditEvent.objects.filter(tenant=alice.tenant, action="billing.topup.request").count() == 1
    # a rejected request never pays, even when approved afterwards
    console(alice).post(reverse("console:topup_create"), {"amount": "30.00"})
    second = TopUp.objects.get(tenant=alice.tenant, amount=Decimal("30.00"))
    admin_client.post(url, {"action": "reject", "_selected_action": [str(second.pk)]})
    admin_client.post(url, {"action": "approve", "_selected_action": [str(second.pk)]})
    assert balance(alice) == before + 25 and payments(alice) == 1


def test_bad_amounts_and_members_without_billing_rights_add_nothing(alice, victor):
    for amount in ("0", "-5", "abc", "1000000"):
        resp = console(alice).post(reverse("console:topup_create"), {"amount": amount})
        assert resp.status_code == 400, amount
    assert console(victor).post(reverse("console:topup_create"), {"amount": "25"}).status_code == 403
    assert console(alice).get(reverse("console:topup_create")).status_code == 405  # an action is a POST
    assert not TopUp.objects.exists()


class _StripeStandIn(BaseHTTPRequestHandler):
    """Stripe's API as documented for `POST /v1/checkout/sessions` (form-encoded in, a Session
    object out), recording what it was sent."""

    seen: list[dict] = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        form = {k: v[0] for k, v in parse_qs(body).items()}
        self.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "form": form,
                          "idempotency": self.headers.get("Idempotency-Key")})
        session = {"id": "cs_test_a1b2c3d4e5f6g7h8i9j0", "object": "checkout.session", "mode": "payment",
                   "amount_total": int(form["line_items[0][price_data][unit_amount]"]),
                   "client_reference_id": form["client_reference_id"], "payment_status": "unpaid",
                   "url": "https://checkout.stripe.com/c/pay/cs_test_a1b2c3d4e5f6g7h8i9j0"}
        out = json.dumps(session).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def stripe_stand_in(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StripeStandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _StripeStandIn.seen = []
    settings.BILLING_PAYMENT_PROVIDER = STRIPE
    settings.STRIPE_API_KEY = "sk_test_51Hk2standin"
    settings.STRIPE_WEBHOOK_SECRET = SECRET
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{server.server_address[1]}"
    yield _StripeStandIn.seen
    server.shutdown()


def signed(payload: bytes, *, secret: str = SECRET, t: int | None = None) -> str:
    """Stripe's documented signature: v1 = hex HMAC-SHA256(secret, f"{t}.{payload}")."""
    t = int(time.time()) if t is None else t
    v1 = hmac.new(secret.encode(), f"{t}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={t},v1={v1}"


def event_for(topup: TopUp, **changes) -> bytes:
    event = json.loads(RECORDED.read_text().replace("TOPUP_ID", str(topup.pk)))
    event["data"]["object"].update(changes)
    return json.dumps(event).encode()


def webhook(payload: bytes, signature: str):
    return Client().post("/api/v1/payments/webhook", payload, content_type="application/json",
                         HTTP_STRIPE_SIGNATURE=signature)


def test_stripe_checkout_pays_once_on_its_signed_webhook(alice, stripe_stand_in, caplog):
    before = balance(alice)
    resp = console(alice).post(reverse("console:topup_create"), {"amount": "25.00"})
    assert resp.status_code == 302 and resp["Location"].startswith("https://checkout.stripe.com/c/pay/cs_test_")
    [call] = stripe_stand_in
    topup = TopUp.objects.get(tenant=alice.tenant)
    assert call["path"] == "/v1/checkout/sessions" and call["auth"] == "Bearer sk_test_51Hk2standin"
    assert call["form"]["mode"] == "payment" and call["form"]["client_reference_id"] == str(topup.pk)
    assert call["form"]["line_items[0][price_data][unit_amount]"] == "2500"
    assert topup.provider == "stripe" and topup.provider_ref == "cs_test_a1b2c3d4e5f6g7h8i9j0"
    assert balance(alice) == before  # not paid yet

    payload = event_for(topup)
    # forged: another secret, a changed body, a stale timestamp, no header: 400, nothing changes
    for bad_payload, signature in ((payload, signed(payload, secret="whsec_forged")),
                                   (event_for(topup, amount_total=999999), signed(payload)),
                                   (payload, signed(payload, t=int(time.time()) - 3600)),
                                   (payload, "")):
        resp = webhook(bad_payload, signature)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_signature"
    assert balance(alice) == before and payments(alice) == 0

    assert webhook(payload, signed(payload)).json() == {"received": True, "credited": True}
    for _ in range(2):  # Stripe retries: the same event, re-signed later, credits nothing more
        again = webhook(payload, signed(payload))
        assert again.status_code == 200 and again.json()["credited"] is False
    assert balance(alice) == before + 25 and payments(alice) == 1
    topup.refresh_from_db()
    assert topup.status == TopUpStatus.PAID and topup.paid_event == "evt_1QxYzLJ2eZvKYlo2CtQ8q9Zb"
    assert AuditEvent.objects.filter(tenant=alice.tenant, action="billing.topup.paid").count() == 1
    logged = caplog.text
    assert SECRET not in logged and "sk_test_51Hk2standin" not in logged


def test_a_session_not_paid_or_paying_another_amount_credits_nothing(alice, stripe_stand_in):
    console(alice).post(reverse("console:topup_create"), {"amount": "25.00"})
    topup = TopUp.objects.get(tenant=alice.tenant)
    before = balance(alice)
    unpaid = event_for(topup, payment_status="unpaid")
    assert webhook(unpaid, signed(unpaid)).json()["credited"] is False
    other = event_for(topup, amount_total=100)
    assert webhook(other, signed(other)).status_code == 400
    assert balance(alice) == before and TopUp.objects.get(pk=topup.pk).status == TopUpStatus.REQUESTED


def test_the_database_refuses_one_event_paying_two_top_ups(alice):
    from django.db import IntegrityError, transaction

    a = TopUp.objects.create(tenant=alice.tenant, amount=Decimal("5"), provider="stripe", paid_event="evt_1")
    with pytest.raises(IntegrityError), transaction.atomic():
        TopUp.objects.create(tenant=alice.tenant, amount=Decimal("5"), provider="stripe", paid_event="evt_1")
    assert a.pk


def test_the_low_balance_notice_offers_add_credit_and_the_return_from_checkout_is_explained(alice, victor):
    from billing import services

    services.credit_grant(tenant=alice.tenant, amount=-(balance(alice) - Decimal("3")), kind=EntryKind.ADJUSTMENT)
    dashboard = console(alice).get("/console/").content.decode()
    assert 'id="low-balance-add-credit"' in dashboard and f'{reverse("console:usage")}#credit' in dashboard
    # a viewer cannot add credit: the notice offers no button
    assert 'id="low-balance-add-credit"' not in console(victor).get("/console/").content.decode()
    back = console(alice).get(reverse("console:usage"), {"topup": "paid"}).content.decode()
    assert "your payment is being confirmed" in back
