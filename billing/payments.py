"""The payment provider: pluggable, a no-op by default (prepaid credit is the default model).

`BILLING_PAYMENT_PROVIDER` names a class with this interface. The default collects
nothing, so an issued invoice not covered by credit stays `issued` until an operator
records a payment in the admin. Called from a task, never inside a transaction.
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string


@dataclass(frozen=True)
class PaymentResult:
    collected: bool
    reference: str = ""
    message: str = ""


class PaymentProvider(Protocol):
    name: str

    def collect(self, *, tenant_id: str, invoice_id: str, amount: Decimal, currency: str) -> PaymentResult: ...


class NullProvider:
    """Collects nothing: tenants pay ahead with credits that operators grant."""

    name = "none"

    def collect(self, *, tenant_id: str, invoice_id: str, amount: Decimal, currency: str) -> PaymentResult:
        return PaymentResult(collected=False, message="no payment provider configured")


def get_provider() -> PaymentProvider:
    return import_string(settings.BILLING_PAYMENT_PROVIDER)()
