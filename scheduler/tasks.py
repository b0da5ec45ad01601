from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache

from gpucloud.catalogue.models import Region
from scheduler.autostop import instances_idle_stop
from scheduler.cycle import run_cycle
from scheduler.reclaim import allocations_audit

logger = logging.getLogger(__name__)

# A burst of submissions asks for one cycle, not one per submission.
_DEBOUNCE_S = 1


def trigger_cycle(region_id: int) -> None:
    """Ask for a cycle of `region_id` soon; debounced through the shared cache."""
    if cache.add(f"scheduler:trigger:{region_id}", 1, timeout=_DEBOUNCE_S):
        schedule_cycle_task.delay(region_id)


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def schedule_cycle_task(region_id: int) -> dict:
    return run_cycle(region_id=region_id).as_dict()


@shared_task(ignore_result=True)
def schedule_tick_task() -> None:
    """Beat's tick: one cycle per active region (a no-op when another worker holds the lock)."""
    for region_id in Region.objects.filter(active=True).values_list("pk", flat=True):
        trigger_cycle(region_id)


@shared_task(ignore_result=True)
def allocations_audit_task() -> dict:
    return allocations_audit()


@shared_task(ignore_result=True)
def idle_autostop_task() -> int:
    """Stop instances idle longer than their `auto_stop_idle_minutes` (scheduler/autostop.py)."""
    return instances_idle_stop()
