from __future__ import annotations

import logging

from celery import shared_task

from volumes.services import purge_due

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def volumes_purge_task() -> int:
    """Hourly (beat): soft-deleted volumes past VOLUME_PURGE_GRACE_S are purged."""
    done = purge_due()
    if done:
        logger.info("volumes purged: %s", ", ".join(str(v.pk) for v in done))
    return len(done)
