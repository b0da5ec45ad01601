"""The Celery app. Every periodic schedule of the platform is defined here, in one place."""
from __future__ import annotations

import os

from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    # Keep the audit log bounded: events older than AUDIT_RETENTION_DAYS are purged nightly.
    "audit-retention": {
        "task": "gpucloud.tenancy.tasks.audit_purge_task",
        "schedule": crontab(hour=3, minute=17),
    },
}
