from __future__ import annotations

import logging

from celery import shared_task

from gpucloud.tenancy.services import audit_purge

logger = logging.getLogger(__name__)


@shared_task(autoretry_for=(Exception,), retry_backoff=True, max_retries=3)
def audit_purge_task() -> int:
    """Nightly: drop audit events older than AUDIT_RETENTION_DAYS."""
    deleted = audit_purge()
    logger.info("audit purge deleted=%d", deleted)
    return deleted
