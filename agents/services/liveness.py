"""Host liveness: hosts that stop heartbeating go DOWN (no new work), and the work on hosts
DOWN for longer than a grace becomes LOST (jobs requeued, no retry spent). The predicate is
pure, in `agents.liveness`; this is its tick (`agents.tasks.hosts_liveness_task`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from agents import fastpath
from agents.choices import HostState
from agents.liveness import is_lost
from agents.models import Host
from scheduler.choices import HOLDING, State
from scheduler.models import Workload
from scheduler.services import workload_requeue_or_end

logger = logging.getLogger(__name__)


@dataclass
class LivenessOutcome:
    down: list[str] = field(default_factory=list)  # host ids marked DOWN now
    lost: list[str] = field(default_factory=list)  # workload ids moved to LOST now


def hosts_mark_down(*, now: datetime | None = None) -> list[str]:
    """Hosts silent for more than HOST_DOWN_AFTER_S go DOWN: they take no new work."""
    now = now or timezone.now()
    # Heartbeats answered by the fast path are in Redis until flushed: write them first,
    # so no host is judged on a liveness time older than what it told us.
    fastpath.heartbeats_flush()
    interval = float(settings.AGENT_HEARTBEAT_INTERVAL_S)
    tolerance = settings.HOST_DOWN_AFTER_S / interval
    down = []
    for pk, name, seen in Host.objects.exclude(state=HostState.DOWN).values_list(
        "pk", "name", "last_heartbeat_at"
    ):
        if not is_lost(seen, now, interval, tolerance):
            continue
        # Guarded on the value we read: a heartbeat that landed meanwhile wins.
        if (
            Host.objects.filter(pk=pk, last_heartbeat_at=seen)
            .exclude(state=HostState.DOWN)
            .update(state=HostState.DOWN, down_since=now)
        ):
            logger.warning("host down host=%s name=%s last_heartbeat_at=%s", pk, name, seen)
            down.append(str(pk))
    # Their next heartbeat must take the slow path, which brings them back.
    fastpath.hosts_changed(host_ids=down)
    return down


def hosts_lose_workloads(*, now: datetime | None = None) -> list[str]:
    """Work on hosts DOWN for longer than HOST_LOST_GRACE_S becomes LOST.

    Their GPUs are freed; jobs go back to the queue without spending a retry.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.HOST_LOST_GRACE_S)
    hosts = {
        pk: (name, since or seen)
        for pk, name, since, seen in Host.objects.filter(state=HostState.DOWN).values_list(
            "pk", "name", "down_since", "last_heartbeat_at"
        )
        if (since or seen) is None or (since or seen) <= cutoff
    }
    if not hosts:
        return []
    lost = []
    victims = (
        Workload.objects.filter(
            state__in=HOLDING, allocations__active=True, allocations__host__in=list(hosts)
        )
        .distinct()
        .order_by("created_at")
    )
    for w in victims:
        host_id = (
            w.allocations.filter(active=True, host__in=list(hosts))
            .values_list("host_id", flat=True)
            .first()
        )
        name, since = hosts.get(host_id, ("?", None))
        when = f" since {since:%Y-%m-%d %H:%M:%S} UTC" if since else ""
        old = w.state
        workload_requeue_or_end(workload=w, ended=State.LOST, reason=f"host {name} down{when}")
        if w.state != old:
            lost.append(str(w.pk))
            logger.warning("workload lost workload=%s host=%s", w.pk, host_id)
    return lost


def hosts_check_liveness(*, now: datetime | None = None) -> LivenessOutcome:
    """The liveness tick: mark silent hosts DOWN, then lose the work of long-DOWN ones."""
    now = now or timezone.now()
    return LivenessOutcome(down=hosts_mark_down(now=now), lost=hosts_lose_workloads(now=now))
