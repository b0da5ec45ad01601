from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    """Per-second metering, ledger, invoices and budgets."""

    name = "billing"

    def ready(self) -> None:
        from billing import receivers, selectors
        from gpucloud.tenancy import hooks
        from scheduler.api import contributors

        # tenancy sits below billing: it announces, billing opens the account and grants the credit
        hooks.on_tenant_created(receivers.tenant_created)
        hooks.on_email_verified(receivers.email_verified)
        # the scheduler sits below too: its instances' and jobs' resources show their cost
        contributors.on_costs(listed=selectors.workload_costs, launched=selectors.launched_cost)
