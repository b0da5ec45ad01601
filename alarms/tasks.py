from __future__ import annotations

import logging
import time

from celery import shared_task

from alarms import runner, services

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=120, time_limit=180)
def alarms_tick_task() -> int:
    """Beat's tick: evaluate the alarms that are due (each once per period, whichever worker)."""
    started = time.monotonic()
    done = services.alarms_evaluate_due()
    if done:
        logger.info("alarms evaluated n=%s seconds=%.3f", len(done), time.monotonic() - started)
    return len(done)


@shared_task(ignore_result=True)
def alarm_actions_retry_task() -> int:
    """Beat's sweep: queue the actions whose retry time has come (the claim makes a double queue harmless)."""
    due = runner.alarm_actions_due()
    for run_id in due:
        runner.alarm_action_task.delay(run_id)
    return len(due)
