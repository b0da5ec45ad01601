"""Billing's periodic and after-commit tasks. Each loads ids and calls one service."""
from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task

from billing import notify, services

logger = logging.getLogger(__name__)


@shared_task(soft_time_limit=300, time_limit=360, ignore_result=True)
def metering_run_task(now: str | None = None) -> dict:
    """Post closed windows of usage (idempotent: safe to repeat or to kill at any point)."""
    stats = services.metering_run(now=datetime.fromisoformat(now) if now else None)
    return {"entries": stats.entries, "metered": stats.metered, "amount": str(stats.amount)}


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def spot_prices_task() -> int:
    return services.spot_prices_update()


@shared_task(soft_time_limit=600, time_limit=660, ignore_result=True)
def invoices_task() -> dict:
    return services.invoices_close()


@shared_task(bind=True, ignore_result=True, max_retries=6, autoretry_for=(notify.DeliveryError,),
             retry_backoff=30, retry_backoff_max=3600, retry_jitter=True, soft_time_limit=60, time_limit=90)
def budget_alert_deliver_task(self, alert_id: int) -> None:
    services.budget_alert_deliver(alert_id=alert_id)


@shared_task(ignore_result=True)
def low_balance_notify_task(tenant_id: str) -> None:
    from django.conf import settings

    from billing.models import Account

    account = Account.objects.select_related("tenant").get(pk=tenant_id)
    notify.email_tenant_admins(
        tenant=account.tenant,
        subject=f"[gpucloud] {account.tenant.name}: low balance",
        body=(f"The balance of {account.tenant.name} is {services.pricing.cents(account.balance)} "
              f"{settings.BILLING_CURRENCY}. At zero new launches are refused, spot work stops at once "
              f"and on-demand work after {settings.BILLING_GRACE_S // 60} minutes. Add credit to keep going."),
    )
