from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Per-second metering, ledger, invoices and budgets."""

    name = "billing"
