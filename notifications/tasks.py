from __future__ import annotations

import logging
import time

from celery import shared_task

from notifications import services

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=60, time_limit=90)
def notifications_tick_task() -> dict[str, int]:
    """Beat's tick: collect what happened, then send what is pending (outside the collect's transaction)."""
    started = time.monotonic()
    made = services.notifications_collect()
    sent = services.notifications_deliver()
    if made or any(sent.values()):
        logger.info("notifications made=%s email=%s webhook=%s seconds=%.3f", made, sent["email"], sent["webhook"],
                    time.monotonic() - started)
    return {"made": made, **sent}
