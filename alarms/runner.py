"""The action runner: one attempt of one alarm action, outside any transaction (actions do network I/O).

A run that raises `ActionRetry` is retried with exponential backoff (30 s, 60 s, ... at most an
hour, ALARM_ACTION_MAX_ATTEMPTS in all); `alarm_actions_due` finds the runs whose retry time has
come (the beat's `alarm_actions_retry_task`). The evaluator in alarms/services.py queues
`alarm_action_task` after the state change commits; the task and its body live here, below the
services, and keep the name they were first queued under (`alarms.tasks.…`), so a message queued
before a deploy still finds its task after it.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from alarms.choices import ActionStatus
from alarms.models import AlarmAction
from alarms.registry import ActionContext, ActionRetry, action_types

logger = logging.getLogger(__name__)

ACTION_LEASE_S = 300  # a run claimed by a worker that died is tried again after this


@shared_task(name="alarms.tasks.alarm_action_task", ignore_result=True, soft_time_limit=60, time_limit=90)
def alarm_action_task(run_id: int) -> None:
    """One attempt of one action (after the state change committed, or a retry whose time came)."""
    alarm_action_run(run_id=run_id)


def backoff_s(attempts: int) -> int:
    """Seconds before the next try after `attempts` failed ones: 30, 60, 120, ... at most an hour."""
    return min(3600, 30 * 2 ** max(0, attempts - 1))


def alarm_action_run(*, run_id: int, now: datetime | None = None) -> str | None:
    """Run one action if it is due and nobody else is running it; returns its status after, or None
    when it was not ours to run. Outside any transaction: actions do network I/O."""
    now = now or timezone.now()
    claimed = AlarmAction.objects.filter(pk=run_id, status=ActionStatus.PENDING, next_attempt_at__lte=now).update(
        attempts=F("attempts") + 1, next_attempt_at=now + timedelta(seconds=ACTION_LEASE_S))
    if not claimed:
        return None
    run = AlarmAction.objects.select_related("alarm__tenant").get(pk=run_id)
    handler = action_types().get(run.type)
    update: dict[str, Any]
    try:
        if handler is None:
            raise LookupError(f"no action of type {run.type!r} is registered")
        outcome = handler.run(ActionContext(alarm=run.alarm, action=run.action, payload=run.payload, run_id=run.pk))
    except ActionRetry as exc:
        if run.attempts >= settings.ALARM_ACTION_MAX_ATTEMPTS:
            update = {"status": ActionStatus.FAILED, "finished_at": now}
        else:
            update = {"next_attempt_at": now + timedelta(seconds=backoff_s(run.attempts))}
        update["last_error"] = str(exc)[:500]
        logger.warning("alarm action failed run=%s alarm=%s type=%s attempt=%s: %s", run.pk, run.alarm_id, run.type,
                       run.attempts, exc)
    except Exception as exc:  # not retryable: a refused URL, a workload gone, a bug in a handler
        update = {"status": ActionStatus.FAILED, "finished_at": now, "last_error": str(exc)[:500] or type(exc).__name__}
        logger.warning("alarm action gave up run=%s alarm=%s type=%s", run.pk, run.alarm_id, run.type, exc_info=True)
    else:
        update = {"status": ActionStatus.DONE, "finished_at": now, "outcome": str(outcome)[:500], "last_error": ""}
    AlarmAction.objects.filter(pk=run.pk).update(**update)
    return update.get("status", ActionStatus.PENDING)


def alarm_actions_due(*, now: datetime | None = None, limit: int = 1000) -> list[int]:
    """Runs waiting for an attempt (a retry whose time has come, or one whose worker died)."""
    now = now or timezone.now()
    return list(AlarmAction.objects.filter(status=ActionStatus.PENDING, next_attempt_at__lte=now)
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
