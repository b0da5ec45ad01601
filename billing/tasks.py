"""Billing's periodic tasks. Each calls one service. The tasks the services queue after commit
(the low-balance email, budget alerts) are in billing/alerts.py, below the services."""
from __future__ import annotations

import logging
from datetime import datetime

from celery import shared_task

from billing import services

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
