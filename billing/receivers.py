"""Billing's answers to the lower layers' hooks, registered in `BillingConfig.ready()`."""
from __future__ import annotations

from billing import services
from billing.models import LedgerEntry
from gpucloud.tenancy.models import Tenant


def tenant_created(tenant: Tenant, signup_credit: bool) -> None:
    """A new tenant's account: with its welcome credit now, or at zero until the address is confirmed."""
    if signup_credit:
        services.signup_credit_grant(tenant=tenant)
    else:
        services.account_for(tenant_id=tenant.pk)


def email_verified(tenant: Tenant) -> LedgerEntry | None:
    """The sign-up credit that waited for the address."""
    return services.signup_credit_grant(tenant=tenant)
