from __future__ import annotations

import logging

from celery import shared_task
from django.core.cache import cache, caches

from gpucloud.catalogue.models import Region
from gpucloud.lib.cache import RedisCache
from scheduler.autostop import instances_idle_stop
from scheduler.choices import HOLDING, State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from scheduler.reclaim import allocations_audit
from scheduler.services import workloads_start_overdue

logger = logging.getLogger(__name__)

# A burst of submissions asks for one cycle, not one per submission: the trigger key is held
# from the trigger until that cycle has run (or for _DEBOUNCE_S, whichever is first).
_DEBOUNCE_S = 1


def _trigger_key(region_id: int) -> str:
    return f"scheduler:trigger:{region_id}"


def _generation_key(region_id: int) -> str:
    return f"scheduler:generation:{region_id}"


def generation(region_id: int) -> int:
    """How many triggers `region_id` has had: a cycle that saw it unchanged from its start to
    its end saw every submission that asked for it."""
    return int(cache.get(_generation_key(region_id)) or 0)


def trigger_cycle(region_id: int) -> None:
    """Ask for a cycle of `region_id` soon (called after the change committed).

    The generation counter is bumped on every call; a cycle is queued only when none is
    queued already (the trigger key). A cycle that started before this call's change
    committed cannot have read it, but it sees the generation move and queues another when
    it ends (`schedule_cycle_task`), so no trigger is lost to the debounce, the beat tick's
    included, and a burst still costs one cycle at a time.
    """
    redis_cache = caches["default"]
    if isinstance(redis_cache, RedisCache):  # one round trip: both commands as Django's cache writes them
        pipe = redis_cache._cache.get_client(write=True).pipeline(transaction=False)
        pipe.incr(redis_cache.make_and_validate_key(_generation_key(region_id)))  # from 0 when missing
        pipe.set(redis_cache.make_and_validate_key(_trigger_key(region_id)), 1, nx=True, ex=_DEBOUNCE_S)
        first = pipe.execute()[1]
    else:
        key = _generation_key(region_id)
        cache.add(key, 0, timeout=None)
        try:
            cache.incr(key)
        except ValueError:  # evicted between the two calls: it counts from here
            cache.add(key, 1, timeout=None)
        first = cache.add(_trigger_key(region_id), 1, timeout=_DEBOUNCE_S)
    if first:
        schedule_cycle_task.delay(region_id)


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def schedule_cycle_task(region_id: int) -> dict:
    seen = generation(region_id)  # before the cycle reads the queue
    stats = run_cycle(region_id=region_id)
    if stats.ran:
        # Free the trigger first, then look: a trigger after the delete queues its own cycle,
        # one before it moved the generation we read next.
        cache.delete(_trigger_key(region_id))
        if generation(region_id) != seen and cache.add(_trigger_key(region_id), 1, timeout=_DEBOUNCE_S):
            schedule_cycle_task.delay(region_id)
    # Not ran: the cycle holding the region's lock looks at the generation when it ends.
    return stats.as_dict()


@shared_task(ignore_result=True)
def schedule_tick_task() -> None:
    """Beat's tick: one cycle per active region with work (queued, or holding GPUs: deadlines,
    reservations and reclaims move with time), a no-op when another worker holds the lock.

    A region without any is skipped: its cycle would plan nothing, and whatever gives it work
    (a submission, a requeue) triggers a cycle itself. One query for all regions."""
    busy = set(Workload.objects.filter(state__in=[State.PENDING, *HOLDING])
               .values_list("region_id", flat=True).order_by().distinct())
    for region_id in Region.objects.filter(active=True, pk__in=busy).values_list("pk", flat=True):
        trigger_cycle(region_id)


@shared_task(ignore_result=True)
def allocations_audit_task() -> dict:
    return allocations_audit()


@shared_task(ignore_result=True)
def workloads_start_overdue_task() -> int:
    """Fail work still SCHEDULED/STARTING past the bound (scheduler.services.workloads_start_overdue)."""
    return len(workloads_start_overdue())


@shared_task(ignore_result=True)
def idle_autostop_task() -> int:
    """Stop instances idle longer than their `auto_stop_idle_minutes` (scheduler/autostop.py)."""
    return instances_idle_stop()
