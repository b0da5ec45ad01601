"""Idle auto-stop: an instance launched with `auto_stop_idle_minutes` is stopped once every
GPU it holds has been idle that long, with the reason in its events and an email to its
owner, as the peers' idle shutdown does.

Idle is the agents' rule (`agents.protocol.IDLE_BELOW`, utilisation under 5 %), kept per
GPU as `Gpu.idle_since` by both heartbeat paths. An instance counts as idle from the later
of its start and its GPUs' `idle_since`: a GPU that sat idle before the instance was
placed on it does not shorten the instance's grace. A GPU never measured, or one a share
of which another workload keeps busy, is not idle. Run every minute by the beat task
`scheduler.tasks.idle_autostop_task`; two queries whatever the number of instances, then
one stop (the ordinary `workload_stop`, so billing ends and the agent stops the container)
per instance found idle.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from agents.protocol import IDLE_BELOW
from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.selectors import tenant_admin_emails
from scheduler.choices import State, WorkloadKind
from scheduler.models import Allocation, Workload
from scheduler.services import workload_stop

logger = logging.getLogger(__name__)

REASON_PREFIX = "idle auto-stop:"


def idle_reason(minutes: int) -> str:
    return (f"{REASON_PREFIX} every GPU under {IDLE_BELOW * 100:.0f} % utilisation for {minutes} min "
            "(auto_stop_idle_minutes)")


def idle_instances(*, now: datetime) -> list[Workload]:
    """Running instances with auto-stop whose every GPU has been idle long enough."""
    candidates = {
        w.pk: w for w in Workload.objects.filter(kind=WorkloadKind.INSTANCE, state=State.RUNNING,
                                                 auto_stop_idle_minutes__isnull=False, deleted_at__isnull=True)
        .select_related("tenant", "created_by")
    }
    if not candidates:
        return []
    gpus: dict = defaultdict(list)
    for wid, idle_since in (Allocation.objects.filter(workload_id__in=list(candidates), active=True)
                            .order_by().values_list("workload_id", "gpu__idle_since")):
        gpus[wid].append(idle_since)
    out = []
    for wid, w in candidates.items():
        since = gpus.get(wid)
        if not since or any(s is None for s in since):
            continue
        idle_from = max([*since, w.started_at or now])
        if now - idle_from >= timedelta(minutes=w.auto_stop_idle_minutes):
            out.append(w)
    return out


def instances_idle_stop(*, now: datetime | None = None) -> int:
    """Stop every instance `idle_instances` finds; returns how many were stopped."""
    now = now or timezone.now()
    stopped = 0
    for w in idle_instances(now=now):
        reason = idle_reason(w.auto_stop_idle_minutes)
        try:
            with transaction.atomic():
                workload_stop(workload=w, reason=reason)
                transaction.on_commit(lambda w=w, reason=reason: _notify(w, reason))
        except NotFoundError:
            continue  # deleted meanwhile
        stopped += 1
        logger.info("idle auto-stop workload=%s tenant=%s minutes=%s", w.pk, w.tenant_id,
                    w.auto_stop_idle_minutes)
    return stopped


def _notify(w: Workload, reason: str) -> None:
    """Email the instance's creator and the tenant's admins (never fails the stop)."""
    try:
        to = set(tenant_admin_emails(tenant=w.tenant))
        if w.created_by is not None and w.created_by.email:
            to.add(w.created_by.email)
        if to:
            send_mail(f"Instance {w.name} was stopped: idle for {w.auto_stop_idle_minutes} min",
                      f"Your instance {w.name} ({w.pk}) in {w.tenant.name} was stopped.\n\n"
                      f"Reason: {reason}\n\nIts billing stopped with it. Launch it again when you need it.\n",
                      settings.DEFAULT_FROM_EMAIL, sorted(to))
    except Exception:
        logger.exception("idle auto-stop notice failed workload=%s", w.pk)
