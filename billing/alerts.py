"""What the services queue after commit: the low-balance email and the budget alerts.

Each is a task and the body it runs. They sit below billing/services.py (which queues them
in `balances_enforce` and `budgets_check`) and import nothing of it, so the services import
them at the top; billing/tasks.py keeps the periodic tasks, which call the services. The
tasks keep the names they were first queued under (`billing.tasks.…`), so a message queued
before a deploy still finds its task after it.
"""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from billing import notify, pricing
from billing.models import Account, BudgetAlert
from gpucloud.lib.outbound import OutboundRefused

logger = logging.getLogger(__name__)


@shared_task(name="billing.tasks.budget_alert_deliver_task", bind=True, ignore_result=True, max_retries=6,
             autoretry_for=(notify.DeliveryError,), retry_backoff=30, retry_backoff_max=3600, retry_jitter=True,
             soft_time_limit=60, time_limit=90)
def budget_alert_deliver_task(self, alert_id: int) -> None:
    budget_alert_deliver(alert_id=alert_id)


@shared_task(name="billing.tasks.low_balance_notify_task", ignore_result=True)
def low_balance_notify_task(tenant_id: str) -> None:
    account = Account.objects.select_related("tenant").get(pk=tenant_id)
    notify.email_tenant_admins(
        tenant=account.tenant,
        subject=f"[gpucloud] {account.tenant.name}: low balance",
        body=(f"The balance of {account.tenant.name} is {pricing.cents(account.balance)} "
              f"{settings.BILLING_CURRENCY}. At zero new launches are refused, spot work stops at once "
              f"and on-demand work after {settings.BILLING_GRACE_S // 60} minutes. Add credit to keep going."),
    )


def budget_alert_deliver(*, alert_id: int) -> None:
    """Email and webhook for one alert. Runs in a task, outside any transaction.

    Each channel is marked done once it succeeded, so a retry repeats only what failed.
    Raises `notify.DeliveryError` when the webhook failed (the task retries). A webhook URL the
    outbound guard refuses now is recorded in `last_error` and not sent, nor retried.
    """
    alert = BudgetAlert.objects.select_related("budget__tenant").get(pk=alert_id)
    budget = alert.budget
    if budget.notify_email and alert.email_sent_at is None:
        notify.email_tenant_admins(
            tenant=budget.tenant,
            subject=f"[gpucloud] {budget.tenant.name}: budget {budget.name!r} at {alert.threshold} %",
            body=(f"Spend this month ({alert.month:%B %Y}) reached {alert.spend} {settings.BILLING_CURRENCY}, "
                  f"{alert.threshold} % of the budget {budget.name!r} ({budget.monthly_amount})."
                  + (" New launches are refused until next month." if budget.hard_stop
                     and alert.threshold >= 100 else "")),
        )
        BudgetAlert.objects.filter(pk=alert.pk).update(email_sent_at=timezone.now())
    if budget.webhook_url and alert.webhook_delivered_at is None:
        payload = {
            "type": "budget.threshold", "alert_id": alert.pk, "tenant": str(budget.tenant_id),
            "budget": str(budget.pk), "budget_name": budget.name, "month": alert.month.isoformat(),
            "threshold": alert.threshold, "spend": str(alert.spend), "monthly_amount": str(budget.monthly_amount),
            "currency": settings.BILLING_CURRENCY, "hard_stop": budget.hard_stop,
        }
        BudgetAlert.objects.filter(pk=alert.pk).update(webhook_attempts=F("webhook_attempts") + 1)
        try:
            notify.webhook_post(url=budget.webhook_url, secret=budget.webhook_secret, payload=payload)
        except OutboundRefused as exc:
            # Checked at save and again here: DNS (or the operator's setting) may have changed
            # since. Nothing was sent; a retry would be refused the same way.
            logger.warning("webhook refused alert=%s budget=%s tenant=%s: %s", alert.pk, budget.pk,
                           budget.tenant_id, exc)
            BudgetAlert.objects.filter(pk=alert.pk).update(last_error=f"refused: {exc}"[:500])
            return
        except notify.DeliveryError as exc:
            BudgetAlert.objects.filter(pk=alert.pk).update(last_error=str(exc)[:500])
            raise
        BudgetAlert.objects.filter(pk=alert.pk).update(webhook_delivered_at=timezone.now(), last_error="")
