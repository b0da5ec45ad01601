"""The Celery app. Every periodic schedule of the platform is defined here, in one place.

The intervals an operator may set (SCHEDULER_TICK_S, METERING_INTERVAL_S, ...) are settings,
read from the environment once, in gpucloud/settings.py: the schedule reads them from there
when Celery loads its configuration (after Django's settings), so the beat and the code that
depends on an interval (metering windows, for one) cannot disagree about it.
"""
from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.schedules import crontab
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpucloud.settings")

app = Celery("gpucloud")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {
        # The scheduling loop: a cycle per region every SCHEDULER_TICK_S; submissions trigger one at once.
        "scheduler-tick": {
            "task": "scheduler.tasks.schedule_tick_task",
            "schedule": float(settings.SCHEDULER_TICK_S),
        },
        # Safety net: free allocations whose workload no longer holds GPUs, repair counter drift.
        "allocations-audit": {"task": "scheduler.tasks.allocations_audit_task", "schedule": 60.0},
        # The bound on starting: work still SCHEDULED/STARTING past WORKLOAD_START_TIMEOUT_S fails, GPUs freed.
        "start-overdue": {"task": "scheduler.tasks.workloads_start_overdue_task", "schedule": 30.0,
                          "options": {"expires": 60}},
        # Host liveness: silent hosts go DOWN, work on hosts DOWN past the grace period is LOST.
        "hosts-liveness": {"task": "agents.tasks.hosts_liveness_task", "schedule": 5.0},
        # Instances launched with auto_stop_idle_minutes stop once every GPU has idled that long.
        "idle-autostop": {"task": "scheduler.tasks.idle_autostop_task", "schedule": 60.0},
        # Alarms: evaluate the due ones (each once per period, whichever worker), retry failed actions.
        "alarms-tick": {"task": "alarms.tasks.alarms_tick_task", "schedule": 10.0, "options": {"expires": 30}},
        "alarm-actions-retry": {"task": "alarms.tasks.alarm_actions_retry_task", "schedule": 15.0},
        # Notifications: what happened (transitions, notices, budgets, hosts) told to whoever chose to hear.
        "notifications-tick": {"task": "notifications.tasks.notifications_tick_task", "schedule": 5.0,
                               "options": {"expires": 20}},
        # Heartbeats answered from Redis (agents/fastpath.py): samples and liveness -> PostgreSQL.
        "heartbeats-flush": {"task": "agents.tasks.heartbeats_flush_task", "schedule": 1.0,
                             "options": {"expires": 10}},
        # Autoscaling groups and batch pools: scheduled actions, policies, health (autoscaling/reconcile.py).
        "autoscaling-reconcile": {"task": "autoscaling.tasks.autoscaling_reconcile_task",
                                  "schedule": float(settings.AUTOSCALING_TICK_S),
                                  "options": {"expires": 60}},
        # GPU samples: raw ones averaged into minutes, both pruned to their retention.
        "gpu-samples-rollup": {"task": "agents.tasks.gpu_samples_rollup_task", "schedule": 60.0},
        # Billing: post closed windows of usage (idempotent), then enforce balances and budgets.
        "metering": {"task": "billing.tasks.metering_run_task",
                     "schedule": float(settings.METERING_INTERVAL_S)},
        # Spot prices follow each region's GPU allocation (billing/pricing.py spot_price).
        "spot-prices": {"task": "billing.tasks.spot_prices_task",
                        "schedule": float(settings.SPOT_RECOMPUTE_S)},
        # Invoices: refresh this month's drafts, issue last month's once fully metered.
        "invoices": {"task": "billing.tasks.invoices_task", "schedule": crontab(minute=23)},
        # Volumes deleted more than VOLUME_PURGE_GRACE_S ago are purged (volumes/services.py purge_due).
        "volumes-purge": {"task": "volumes.tasks.volumes_purge_task", "schedule": crontab(minute=41)},
        # Keep the audit log bounded: events older than AUDIT_RETENTION_DAYS are purged nightly.
        "audit-retention": {
            "task": "gpucloud.tenancy.tasks.audit_purge_task",
            "schedule": crontab(hour=3, minute=17),
        },
    }


# A promise: evaluated when Celery first reads its configuration, Django's settings loaded.
app.add_defaults(lambda: {"beat_schedule": beat_schedule()})
