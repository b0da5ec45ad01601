"""One scheduling cycle of one region: load → plan (the pure core) → apply, under a lock.

Only one cycle runs per region at a time: a PostgreSQL advisory lock (a cache lock
on the SQLite demo), so any number of workers is safe. No network I/O happens
inside the apply transaction.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F
from django.dispatch import Signal
from django.utils import timezone

from gpucloud.lib import promstore
from scheduler import core, snapshot
from scheduler.apply import ApplyResult, apply
from scheduler.choices import HOLDING, State
from scheduler.core.gcpause import gc_paused
from scheduler.models import RegionSchedulerSettings, Workload
from scheduler.services import TIMEOUT_PREFIX, workload_notice_served, workload_transition

logger = logging.getLogger(__name__)

# Sent with `region_id` once a cycle has read its queue and before it plans: what commits from
# here on is not in this cycle (tests use it to order a submission against a running cycle).
cycle_loaded = Signal()

# First key of the two-int advisory lock: "gpuc" in ASCII, so other users of advisory locks don't collide.
_LOCK_NAMESPACE = 0x67707563


@contextlib.contextmanager
def region_lock(region_id: int) -> Iterator[bool]:
    """Yield whether this process holds the region's cycle lock."""
    if not settings.SCHEDULER_LOCK:  # only the concurrency tests turn it off, to test the DB guard
        yield True
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s)", [_LOCK_NAMESPACE, region_id])
            got = cur.fetchone()[0]
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s, %s)", [_LOCK_NAMESPACE, region_id])
        return
    key = f"scheduler:cycle-lock:{region_id}"
    got = cache.add(key, 1, timeout=settings.SCHEDULER_CYCLE_TIME_LIMIT_S)
    try:
        yield got
    finally:
        if got:
            cache.delete(key)


def policy_for(region_id: int) -> core.Policy:
    conf = RegionSchedulerSettings.objects.filter(region_id=region_id).first()
    name = conf.policy if conf else settings.SCHEDULER_POLICY
    policy = core.get_policy(name)
    if conf:
        policy = policy.with_(notice_s=float(conf.notice_s), reclaim_idle_util=conf.reclaim_idle_util,
                              reclaim_idle_s=float(conf.reclaim_idle_s), preempt_cap=conf.preempt_cap)
        if conf.mode:
            policy = policy.with_(mode=conf.mode)
    return policy


@dataclass
class CycleStats:
    region_id: int
    ran: bool
    pending: int = 0
    hosts: int = 0
    gpus: int = 0
    notices_expired: int = 0
    timeouts: int = 0
    retries: int = 0  # apply transactions PostgreSQL rolled back for a deadlock and that ran again
    apply: ApplyResult = field(default_factory=ApplyResult)
    load_s: float = 0.0
    plan_s: float = 0.0
    apply_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def run_cycle(*, region_id: int, now: datetime | None = None) -> CycleStats:
    with region_lock(region_id) as got:
        if not got:
            return CycleStats(region_id=region_id, ran=False)
        # the load and apply build as many objects as the plan: no cyclic GC for all of it
        with gc_paused():
            return _cycle(region_id, now or timezone.now(), placed_now=now is None)


def _enforce_deadlines(region_id: int, now: datetime, stats: CycleStats) -> None:
    """Notices that ran out become PREEMPTED; jobs past their timeout stop as FAILED."""
    for w in Workload.objects.filter(region_id=region_id, state__in=HOLDING, stop_by__lte=now):
        workload_notice_served(workload=w)
        stats.notices_expired += 1
    running = Workload.objects.filter(region_id=region_id, state=State.RUNNING, timeout_s__isnull=False,
                                      started_at__isnull=False)
    if connection.vendor == "postgresql":
        deadline = ExpressionWrapper(F("started_at") + F("timeout_s") * timedelta(seconds=1),
                                     output_field=DateTimeField())
        overdue = list(running.alias(deadline=deadline).filter(deadline__lte=now))
    else:  # SQLite cannot multiply an interval; the demo's handful of jobs are checked here
        overdue = [w for w in running if w.started_at + timedelta(seconds=w.timeout_s) <= now]
    for w in overdue:
        workload_transition(workload=w, to=State.STOPPING,
                            reason=f"{TIMEOUT_PREFIX} ran longer than {w.timeout_s} s")
        stats.timeouts += 1


# PostgreSQL's "deadlock detected" and "could not serialize": the whole transaction was rolled back.
_RETRYABLE = {"40P01", "40001"}


def _apply_retrying(plan: core.Plan, cycle: snapshot.CycleInput, now: datetime,
                    stats: CycleStats, attempts: int = 3) -> ApplyResult:
    """Apply in one transaction; a deadlock rolls it back whole, so the same plan is applied again.

    Only cycles running without the region lock (the concurrency tests) can deadlock each
    other; the guarded claims re-check every GPU on the retry, so nothing is booked twice.
    """
    for attempt in range(attempts):
        try:
            with transaction.atomic():
                return apply(plan=plan, cycle=cycle, now=now)
        except OperationalError as exc:
            code = getattr(exc.__cause__, "sqlstate", None)
            if code not in _RETRYABLE or attempt == attempts - 1:
                raise
            stats.retries += 1
            logger.warning("cycle region=%s apply rolled back (%s), applying again", stats.region_id, code)
    raise AssertionError("unreachable")


def _record_metrics(stats: CycleStats, cycle: snapshot.CycleInput, plan: core.Plan | None,
                    now: datetime) -> None:
    """Phase durations, placements, preemptions and queue waits into Redis (`/metrics`)."""
    region = str(stats.region_id)
    batch = promstore.Batch()
    for phase, seconds in (("load", stats.load_s), ("plan", stats.plan_s), ("apply", stats.apply_s)):
        if phase == "load" or plan is not None:
            batch.observe("gpucloud_scheduler_cycle_phase_seconds", (region, phase), seconds)
    batch.inc("gpucloud_scheduler_placements", (region,), stats.apply.placed)
    batch.inc("gpucloud_scheduler_preemptions", (region,), stats.apply.preempt_notices)
    if plan is not None and stats.apply.placed:
        placed = {d.request_id for d in plan.decisions if isinstance(d, core.Place)}
        for r in cycle.queue:
            if r.request_id in placed:
                batch.observe("gpucloud_scheduler_queue_wait_seconds", (region, r.priority),
                              max(0.0, now.timestamp() - r.submitted_at))
    batch.send()


def _cycle(region_id: int, now: datetime, *, placed_now: bool = False) -> CycleStats:
    """One cycle at `now`. With `placed_now` (a cycle on the wall clock) what the apply writes
    (allocations, SCHEDULED events, notices) is stamped when the apply begins, not when the
    cycle did: the GPUs are booked from then, and a GPU another heartbeat released while
    this cycle loaded and planned must not read as held twice (its release comes after the
    cycle's start, before the new booking)."""
    stats = CycleStats(region_id=region_id, ran=True)
    t0 = time.perf_counter()
    with transaction.atomic():
        _enforce_deadlines(region_id, now, stats)
    cycle = snapshot.build(region_id=region_id)
    cycle_loaded.send(sender=None, region_id=region_id)
    stats.pending = len(cycle.queue)
    stats.hosts = len(cycle.snapshot.hosts)
    stats.gpus = sum(len(h.gpus) for h in cycle.snapshot.hosts)
    t1 = time.perf_counter()
    stats.load_s = t1 - t0
    plan = None
    if cycle.queue or cycle.snapshot.allocations:
        plan = core.plan(cycle.snapshot, cycle.queue, policy_for(region_id), now=now.timestamp())
        t2 = time.perf_counter()
        stats.plan_s = t2 - t1
        stats.apply = _apply_retrying(plan, cycle, timezone.now() if placed_now else now, stats)
        stats.apply_s = time.perf_counter() - t2
    _record_metrics(stats, cycle, plan, now)
    logger.info(
        "cycle region=%s pending=%d placed=%d conflicts=%d waiting=%d rejected=%d notices=%d "
        "load_ms=%.1f plan_ms=%.1f apply_ms=%.1f",
        region_id, stats.pending, stats.apply.placed, stats.apply.conflicts, stats.apply.waiting,
        stats.apply.rejected, stats.apply.preempt_notices, stats.load_s * 1e3, stats.plan_s * 1e3,
        stats.apply_s * 1e3,
    )
    return stats
