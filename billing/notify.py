"""Notifications: email to a tenant's owners and admins, and signed webhooks.

Called from Celery tasks only, never inside a transaction (network I/O).

Webhook signature: `X-Gpucloud-Signature: t=<unix time>,v1=<hex>` where
hex = HMAC-SHA256(key = the budget's webhook secret, message = "<t>." + raw body).
Receivers recompute it over the raw body, compare in constant time and reject old `t`.

Webhooks go out through `gpucloud.lib.outbound` only (https, public addresses, checked again
at every delivery, no redirects followed): see docs/billing.md.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from gpucloud.lib import promstore
from gpucloud.lib.outbound import OutboundError, OutboundRefused, outbound_post
from gpucloud.tenancy.models import Tenant
from gpucloud.tenancy.selectors import tenant_admin_emails

SIGNATURE_HEADER = "X-Gpucloud-Signature"


class DeliveryError(Exception):
    """A webhook answered other than 2xx, or could not be reached."""


def sign(*, secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(*, secret: str, header: str, body: bytes, tolerance_s: int = 300, now: float | None = None) -> bool:
    """What a receiver does (and the tests): check the signature and its age."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs((now or time.time()) - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret=secret, timestamp=timestamp, body=body), header)


def webhook_post(*, url: str, secret: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """Sign and POST one event. Raises `OutboundRefused` when the URL may not be called (nothing
    is sent; retrying will not help) and `DeliveryError` when the receiver failed (worth a retry).
    `headers`: more headers to send (an event name, a delivery id)."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    headers = {**(headers or {}), "Content-Type": "application/json", "User-Agent": "gpucloud-webhooks/1",
               SIGNATURE_HEADER: sign(secret=secret, timestamp=int(time.time()), body=body)}
    outcome = "failed"
    try:
        resp = outbound_post(url, body=body, headers=headers, timeout_s=settings.BILLING_WEBHOOK_TIMEOUT_S)
        if 300 <= resp.status < 400:
            raise DeliveryError(f"{url} answered {resp.status} (redirects are not followed)")
        if not 200 <= resp.status < 300:
            raise DeliveryError(f"{url} answered {resp.status}")
        outcome = "ok"
    except OutboundRefused:
        outcome = "refused"
        raise
    except OutboundError as exc:
        raise DeliveryError(f"{url}: {exc}") from exc
    finally:
        promstore.Batch().inc("gpucloud_webhook_deliveries", (outcome,)).send()


def email_tenant_admins(*, tenant: Tenant, subject: str, body: str) -> int:
    to = tenant_admin_emails(tenant=tenant)
    if not to:
        return 0
    return send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
