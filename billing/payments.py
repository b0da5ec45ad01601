"""The payment provider: pluggable, a no-op by default (prepaid credit is the default model).

`BILLING_PAYMENT_PROVIDER` names a class with this interface. Called from services and
views, never inside a transaction (a provider may go over the network).

- `collect`: an issued invoice not covered by credit. The default collects nothing, so it
  stays `issued` until an operator records a payment in the admin.
- `topup_start`: a renter asked to add credit (a `TopUp` row, `requested`). The default
  leaves it for an operator to approve in the admin (labs, invoiced customers); Stripe
  Checkout answers the URL of a checkout page, and its signed webhook pays it
  (`StripeCheckoutProvider.event_verify`, then `billing.services.topup_credit`).
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import stripe
from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class PaymentResult:
    collected: bool
    reference: str = ""
    message: str = ""


@dataclass(frozen=True)
class TopUpStart:
    """What the renter does next: follow `redirect_url` (a provider's payment page), or wait
    for an operator (`redirect_url` empty; `message` says so)."""

    redirect_url: str = ""
    reference: str = ""
    message: str = ""


@dataclass(frozen=True)
class TopUpPaid:
    """A provider's verified word that a top-up was paid: its event id (the idempotency key),
    our top-up's id, and what was paid."""

    event_id: str
    topup_id: str
    amount: Decimal
    currency: str


class InvalidEvent(Exception):
    """A webhook whose signature, timestamp or shape does not verify: nothing is done with it."""


class PaymentProvider(Protocol):
    name: str

    def collect(self, *, tenant_id: str, invoice_id: str, amount: Decimal, currency: str) -> PaymentResult: ...

    def topup_start(self, *, topup_id: str, amount: Decimal, currency: str, success_url: str,
                    cancel_url: str) -> TopUpStart: ...


class NullProvider:
    """Collects nothing: tenants pay ahead with credits that operators grant. A top-up is a
    request an operator approves in the admin (Top-ups → Approve and credit)."""

    name = "none"

    def collect(self, *, tenant_id: str, invoice_id: str, amount: Decimal, currency: str) -> PaymentResult:
        return PaymentResult(collected=False, message="no payment provider configured")

    def topup_start(self, *, topup_id: str, amount: Decimal, currency: str, success_url: str,
                    cancel_url: str) -> TopUpStart:
        return TopUpStart(message="Your request is filed: an operator approves it and the credit "
                                  "appears on your balance then.")


class StripeCheckoutProvider:
    """Stripe Checkout (https://docs.stripe.com/payments/checkout): a top-up opens a Checkout
    Session in `payment` mode for its amount and sends the renter to its page; Stripe then posts
    `checkout.session.completed` to our webhook, signed with the endpoint's secret.

    The official library does the HTTP and the signature check (`Stripe-Signature:
    t=…,v1=…`, HMAC-SHA256 of "t.payload" with the secret, within the tolerance), so none of
    it is written here. `STRIPE_API_BASE` points the client at a stand-in in the tests (this
    machine cannot reach Stripe). The API key and the webhook secret come from the settings
    and are never logged or shown.
    """

    name = "stripe"

    def _client(self) -> stripe.StripeClient:
        return stripe.StripeClient(settings.STRIPE_API_KEY, base_addresses={"api": settings.STRIPE_API_BASE},
                                   max_network_retries=1)

    def collect(self, *, tenant_id: str, invoice_id: str, amount: Decimal, currency: str) -> PaymentResult:
        # Checkout collects only what the renter pays now: an issued invoice waits for a top-up
        # or an operator, as with the default provider.
        return PaymentResult(collected=False, message="Stripe Checkout collects top-ups only")

    def topup_start(self, *, topup_id: str, amount: Decimal, currency: str, success_url: str,
                    cancel_url: str) -> TopUpStart:
        session = self._client().v1.checkout.sessions.create(params={
            "mode": "payment",
            "client_reference_id": topup_id,
            "metadata": {"topup_id": topup_id},
            "line_items": [{"quantity": 1, "price_data": {
                "currency": currency.lower(), "unit_amount": int(amount * 100),
                "product_data": {"name": "gpucloud credit"}}}],
            "success_url": success_url,
            "cancel_url": cancel_url,
        }, options={"idempotency_key": f"topup-{topup_id}"})
        return TopUpStart(redirect_url=session.url or "", reference=session.id)

    def event_verify(self, *, payload: bytes, signature: str) -> TopUpPaid | None:
        """The verified top-up a webhook reports as paid, None for events that pay nothing
        (other types, unpaid sessions); `InvalidEvent` when it does not verify."""
        if not settings.STRIPE_WEBHOOK_SECRET:
            raise InvalidEvent("no webhook secret is configured")
        try:
            event = self._client().construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET,
                                                   tolerance=settings.STRIPE_WEBHOOK_TOLERANCE_S)
        except (stripe.SignatureVerificationError, ValueError) as exc:
            raise InvalidEvent("the signature does not verify") from exc
        if event.type not in ("checkout.session.completed", "checkout.session.async_payment_succeeded"):
            return None
        session: dict[str, Any] = event.data.object.to_dict()  # plain data: the fields Stripe documents
        if session.get("payment_status") != "paid":
            return None  # an async payment not settled yet: its *_succeeded event pays it
        topup_id = session.get("client_reference_id") or (session.get("metadata") or {}).get("topup_id")
        total = session.get("amount_total")
        if not topup_id or total is None:
            raise InvalidEvent("the session names no top-up or amount")
        return TopUpPaid(event_id=event.id, topup_id=str(topup_id), amount=Decimal(total) / 100,
                         currency=str(session.get("currency") or "").upper())


def get_provider() -> PaymentProvider:
    return import_string(settings.BILLING_PAYMENT_PROVIDER)()
