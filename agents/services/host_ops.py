"""The operators' actions on hosts and GPUs (the admin's buttons, docs/operators.md): cordon,
drain, uncordon, allow a host's replacement, put a repaired GPU back in service. Each is audited
with the current actor.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from agents import fastpath
from agents.choices import AdminState, HostState
from agents.models import Gpu, Host
from gpucloud.lib.errors import Conflict
from gpucloud.tenancy.audit import audit_record
from scheduler.choices import State, WorkloadKind
from scheduler.cycle import policy_for
from scheduler.hooks import cycle_wanted, holding_changed
from scheduler.models import Workload

logger = logging.getLogger(__name__)


def _host_set_admin_state(*, host: Host, to: str) -> Host:
    """Record the operator's choice; the host takes it now unless it is DOWN (then on return).

    Audited with the current actor (the admin sets it for its requests)."""
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        old = locked.state
        locked.admin_state = to
        if locked.state != HostState.DOWN:
            locked.state = to
        locked.save(update_fields=["admin_state", "state"])
        verb = {AdminState.READY: "uncordon", AdminState.CORDONED: "cordon"}.get(to, "drain")
        audit_record(
            tenant=None,
            action=f"host.{verb}",
            obj=locked,
            data={"from": old, "to": locked.state, "admin_state": to},
        )
        if to == AdminState.READY and old != locked.state:
            cycle_wanted(locked.region_id)  # capacity is back
    logger.info("host %s host=%s name=%s state=%s", to, locked.pk, locked.name, locked.state)
    return locked


def host_cordon(*, host: Host) -> Host:
    """No new work lands on `host`; what runs there keeps running."""
    return _host_set_admin_state(host=host, to=AdminState.CORDONED)


def host_uncordon(*, host: Host) -> Host:
    """`host` takes new work again (once it heartbeats, if it is DOWN)."""
    return _host_set_admin_state(host=host, to=AdminState.READY)


def host_drain(*, host: Host, now: datetime | None = None) -> tuple[Host, list[str]]:
    """Empty `host` for maintenance: no new work lands there; batch jobs (restartable) get
    the region's preemption notice (default 30 s, time to checkpoint) and then go back to
    the queue as PREEMPTED -> PENDING without spending a retry, by the scheduler's cycle
    exactly as a preempted job; instances run until their owners stop them. The host stays
    DRAINING (also across an outage) until uncordoned.
    Returns the host and the ids of the jobs given notice now."""
    now = now or timezone.now()
    host = _host_set_admin_state(host=host, to=AdminState.DRAINING)
    notice_s = policy_for(host.region_id).notice_s
    stop_by = now + timedelta(seconds=notice_s)
    noticed = []
    jobs = (
        Workload.objects.filter(
            kind=WorkloadKind.JOB,
            state__in=(State.SCHEDULED, State.STARTING, State.RUNNING),
            allocations__active=True,
            allocations__host=host,
        )
        .distinct()
        .order_by("created_at")
    )
    for w in jobs:
        # a checkpointing job's notice lasts its grace at least, as for a preemption
        stop = now + timedelta(seconds=max(notice_s, w.checkpoint_grace_s or 0))
        # a job already on notice (preempted) keeps its earlier deadline
        if Workload.objects.filter(pk=w.pk, stop_by__isnull=True).update(
            stop_by=stop, reason=f"host {host.name} is draining; stopping at {stop:%H:%M:%S} UTC"
        ):
            noticed.append(str(w.pk))
    if noticed:
        holding_changed(noticed)  # a checkpointing job gets its signal
    logger.info("host drained host=%s noticed=%s stop_by=%s", host.pk, noticed, stop_by.isoformat())
    return host, noticed


def gpu_mark_healthy(*, gpu: Gpu) -> Gpu:
    """An operator repaired `gpu` (reset, replaced): it takes work again."""
    reason = gpu.unhealthy_reason
    Gpu.objects.filter(pk=gpu.pk).update(healthy=True, unhealthy_reason="", unhealthy_since=None)
    gpu.refresh_from_db()
    fastpath.hosts_changed(host_ids=[gpu.host_id])  # a still-failing GPU is caught again
    audit_record(tenant=None, action="gpu.mark_healthy", obj=gpu, data={"was": reason})
    cycle_wanted(gpu.host.region_id)  # capacity is back
    logger.info("gpu marked healthy gpu=%s was=%s", gpu.pk, reason)
    return gpu


def host_replace_allow(*, host: Host, now: datetime | None = None) -> Host:
    """The operator's "Replace host": the next registration of `host`'s name with a valid
    bootstrap token of its region takes it over (a re-installed machine that lost its
    state dir). Its current agent keeps working until then; the takeover revokes its token.
    Audited with the current actor."""
    now = now or timezone.now()
    with transaction.atomic():
        updated = Host.objects.filter(pk=host.pk).update(replace_allowed_at=now)
        if not updated:
            raise Conflict(f"Host {host.name!r} no longer exists.")
        audit_record(tenant=None, action="host.replace_allow", obj=host, data={"name": host.name})
    host.replace_allowed_at = now
    logger.info("host replace allowed host=%s name=%s", host.pk, host.name)
    return host
