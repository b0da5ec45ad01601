"""The periodic tasks run on a real Celery worker process over the real Redis broker."""
from __future__ import annotations

import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from gpucloud.celery import app, beat_schedule
from gpucloud.tenancy.models import AuditEvent
from gpucloud.tenancy.tasks import audit_purge_task


def test_beat_schedule_names_real_tasks():
    app.loader.import_default_modules()
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in app.tasks, entry["task"]


def test_the_beat_reads_its_intervals_from_the_settings():
    """One parse of the environment (gpucloud/settings.py through gpucloud.lib.env): the beat's
    intervals are the settings the code that depends on them reads (metering windows, spot
    prices), not a second reading of the same variables with defaults of their own."""
    every = {name: entry["schedule"] for name, entry in app.conf.beat_schedule.items()}
    assert (every["scheduler-tick"], every["autoscaling-reconcile"], every["metering"], every["spot-prices"]) == (
        settings.SCHEDULER_TICK_S, settings.AUTOSCALING_TICK_S, settings.METERING_INTERVAL_S,
        settings.SPOT_RECOMPUTE_S)


def test_a_changed_setting_changes_the_schedule(settings):
    settings.METERING_INTERVAL_S, settings.AUTOSCALING_TICK_S = 7, 11
    every = {name: entry["schedule"] for name, entry in beat_schedule().items()}
    assert (every["metering"], every["autoscaling-reconcile"]) == (7.0, 11.0)


def test_audit_purge_runs_on_a_worker(worker):
    AuditEvent.objects.create(actor="system", action="old", object_type="t",
                              created_at=timezone.now() - timedelta(days=settings.AUDIT_RETENTION_DAYS + 1))
    AuditEvent.objects.create(actor="system", action="new", object_type="t")
    audit_purge_task.delay()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and AuditEvent.objects.filter(action="old").exists():
        time.sleep(0.2)
    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["new"]
