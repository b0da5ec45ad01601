"""What tenancy tells the apps above it, without importing them (docs/architecture.md).

Billing registers in its `AppConfig.ready()`; tenancy calls, inside its transaction:

- `tenant_created(tenant, signup_credit)`: a tenant was made; `signup_credit` says whether
  its welcome credit is due now (operators' tenants) or waits for the address (sign-up).
- `email_verified(tenant)`: the owner confirmed the address; returns what the handlers
  granted (the first non-None answer: billing's ledger entry), for the audit event.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

_tenant_created: list[Callable[[Any, bool], None]] = []
_email_verified: list[Callable[[Any], Any]] = []


def on_tenant_created(fn: Callable[[Any, bool], None]) -> None:
    if fn not in _tenant_created:
        _tenant_created.append(fn)


def on_email_verified(fn: Callable[[Any], Any]) -> None:
    if fn not in _email_verified:
        _email_verified.append(fn)


def tenant_created(tenant: Any, *, signup_credit: bool) -> None:
    for fn in _tenant_created:
        fn(tenant, signup_credit)


def email_verified(tenant: Any) -> Any:
    answers = [fn(tenant) for fn in _email_verified]
    return next((a for a in answers if a is not None), None)
