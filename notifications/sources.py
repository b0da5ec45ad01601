"""Where notifications come from: facts other apps already record, read after the fact.

    transition log (scheduler.WorkloadEvent) ──classify()──▶ instance / job events
    containers lost or restarted (ContainerEvent) ─────────▶ container lost
    workloads under notice (stop_by)         ──────────────▶ preemption notice
    budget alerts (billing.BudgetAlert)      ──────────────▶ budget threshold
    accounts warned of a low balance          ──────────────▶ low balance
    hosts DOWN / past the grace, unhealthy GPUs ───────────▶ operators' host events

Like billing's metering, nothing calls into this app from a hot path: the collector
(`services.notifications_collect`, every few seconds on beat) scans each log from its cursor
to `now - NOTIFY_SETTLE_S` and each "what is true now" set, and turns what it finds into
`Occurrence`s. Each has a `key` naming what happened; a person is told of a key once (a unique
constraint), so a scan that overlaps an earlier one, or two collectors at once, add nothing.

`classify` is pure: which event, if any, a transition is.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from agents.choices import HostState
from agents.models import Gpu, Host
from billing.models import Account, BudgetAlert
from notifications.choices import Event
from scheduler.autostop import REASON_PREFIX as IDLE_PREFIX
from scheduler.choices import State, WorkloadKind
from scheduler.models import ContainerEvent, Workload, WorkloadEvent


@dataclass(frozen=True)
class Occurrence:
    event: str
    key: str
    subject: str
    body: str
    link: str = ""
    tenant_id: Any = None  # None: an operator's event
    workload_owner_id: int | None = None  # who launched it (for the "mine" scope); None: tenant-wide


def classify(*, kind: str, from_state: str, to_state: str, reason: str) -> str | None:
    """The event a transition is, or None (most are steps nobody needs to hear of). A container
    lost behind the agent's back is told from its own log (`container_events`); the failure it
    may lead to is told here as a failure."""
    if kind == WorkloadKind.INSTANCE:
        if to_state == State.RUNNING:
            return Event.INSTANCE_RUNNING
        if to_state == State.STOPPED:
            return Event.IDLE_STOPPED if reason.startswith(IDLE_PREFIX) else Event.INSTANCE_STOPPED
        if to_state == State.PREEMPTED:
            return Event.INSTANCE_STOPPED
        if to_state in (State.FAILED, State.LOST):
            return Event.INSTANCE_FAILED
        return None
    if to_state == State.SUCCEEDED:
        return Event.JOB_SUCCEEDED
    if to_state in (State.FAILED, State.LOST):
        return Event.JOB_FAILED
    return None


def _path(w: Workload) -> str:
    return f"/console/{'instances' if w.kind == WorkloadKind.INSTANCE else 'jobs'}/{w.pk}/"


def _noun(w: Workload) -> str:
    return "Instance" if w.kind == WorkloadKind.INSTANCE else "Job"


_VERB = {Event.INSTANCE_RUNNING: "is running", Event.INSTANCE_STOPPED: "stopped", Event.INSTANCE_FAILED: "failed",
         Event.JOB_SUCCEEDED: "finished", Event.JOB_FAILED: "failed", Event.IDLE_STOPPED: "was stopped: idle",
         Event.CONTAINER_LOST: "lost its container"}


def transitions(*, since: datetime, until: datetime) -> Iterator[Occurrence]:
    rows = (WorkloadEvent.objects.filter(created_at__gte=since, created_at__lt=until)
            .select_related("workload").order_by("created_at", "id"))
    for e in rows.iterator(chunk_size=500):
        w = e.workload
        event = classify(kind=w.kind, from_state=e.from_state, to_state=e.to_state, reason=e.reason)
        if event is None:
            continue
        yield Occurrence(
            event=event, key=f"wev:{e.pk}", tenant_id=w.tenant_id, workload_owner_id=w.created_by_id,
            subject=f"{_noun(w)} {w.name} {_VERB[event]}",
            body=f"{_noun(w)} {w.name} ({w.pk}) went from {e.from_state or 'new'} to {e.to_state} "
                 f"at {e.created_at:%Y-%m-%d %H:%M:%S} UTC.\nReason: {e.reason or '—'}",
            link=_path(w))


def container_events(*, since: datetime, until: datetime) -> Iterator[Occurrence]:
    """Containers lost or restarted without their agent's order (scheduler.ContainerEvent): an
    instance recreated, a restart, told even where no transition followed."""
    rows = (ContainerEvent.objects.filter(created_at__gte=since, created_at__lt=until)
            .select_related("workload").order_by("created_at", "id"))
    for e in rows.iterator(chunk_size=500):
        w = e.workload
        what = "restarted" if e.kind == ContainerEvent.Kind.RESTARTED else "lost"
        yield Occurrence(
            event=Event.CONTAINER_LOST, key=f"cev:{e.pk}", tenant_id=w.tenant_id, workload_owner_id=w.created_by_id,
            subject=f"{_noun(w)} {w.name}: container {what} ({e.count}×)",
            body=f"The container of {_noun(w).lower()} {w.name} ({w.pk}) was {what} without the agent's order "
                 f"at {e.created_at:%Y-%m-%d %H:%M:%S} UTC (the {e.count}. time).\nWhat the agent saw: "
                 f"{e.detail or '—'}",
            link=_path(w))


def notices() -> Iterator[Occurrence]:
    """Work under a preemption notice now: one occurrence per notice (its deadline in the key)."""
    for w in Workload.objects.filter(stop_by__isnull=False, state__in=(State.SCHEDULED, State.STARTING,
                                                                        State.RUNNING)):
        yield Occurrence(
            event=Event.NOTICE, key=f"notice:{w.pk}:{w.stop_by:%Y%m%d%H%M%S}", tenant_id=w.tenant_id,
            workload_owner_id=w.created_by_id,
            subject=f"{_noun(w)} {w.name} must stop by {w.stop_by:%H:%M:%S} UTC",
            body=f"{_noun(w)} {w.name} ({w.pk}) was given notice: {w.stop_cause or 'preempted'}. It stops at "
                 f"{w.stop_by:%Y-%m-%d %H:%M:%S} UTC; save your work (a job that declared a checkpoint signal "
                 f"gets it now).",
            link=_path(w))


def budget_alerts(*, since: datetime, until: datetime) -> Iterator[Occurrence]:
    for a in BudgetAlert.objects.filter(created_at__gte=since, created_at__lt=until).select_related("budget"):
        b = a.budget
        yield Occurrence(
            event=Event.BUDGET, key=f"budget:{a.pk}", tenant_id=b.tenant_id,
            subject=f"Budget {b.name} passed {a.threshold} % ({a.spend} of {b.monthly_amount})",
            body=f"The budget {b.name} has spent {a.spend} of {b.monthly_amount} this month "
                 f"({a.threshold} % threshold){'; new launches are refused past 100 %' if b.hard_stop else ''}.",
            link="/console/usage/")


def low_balances(*, now: datetime) -> Iterator[Occurrence]:
    recent = now - timedelta(days=1)  # a warning older than a day was told before this app
    for a in Account.objects.filter(low_balance_notified_at__gte=recent).select_related("tenant"):
        yield Occurrence(
            event=Event.LOW_BALANCE, key=f"lowbal:{a.tenant_id}:{a.low_balance_notified_at:%Y%m%d%H%M%S}",
            tenant_id=a.tenant_id, subject=f"{a.tenant.name}: low balance ({a.balance} {a.currency})",
            body=f"The balance of {a.tenant.name} is {a.balance} {a.currency}. At zero new launches are refused "
                 "and running work stops after the grace period. Add credit to keep going.",
            link="/console/usage/")


def hosts(*, now: datetime) -> Iterator[Occurrence]:
    grace = timedelta(seconds=settings.HOST_LOST_GRACE_S)
    for h in Host.objects.filter(state=HostState.DOWN, down_since__isnull=False):
        stamp = f"{h.down_since:%Y%m%d%H%M%S}"
        yield Occurrence(event=Event.HOST_DOWN, key=f"hostdown:{h.pk}:{stamp}", subject=f"Host {h.name} is down",
                         body=f"Host {h.name} has not sent a heartbeat since {h.last_heartbeat_at:%Y-%m-%d %H:%M:%S} "
                              f"UTC; marked down at {h.down_since:%H:%M:%S} UTC.",
                         link=f"/admin/agents/host/{h.pk}/change/")
        if now - h.down_since > grace:
            yield Occurrence(event=Event.HOST_LOST, key=f"hostlost:{h.pk}:{stamp}",
                             subject=f"Host {h.name} is lost: its work was given up",
                             body=f"Host {h.name} stayed down past the {grace.seconds} s grace; its instances are "
                                  "LOST and their GPUs freed, jobs with retries left went back to the queue.",
                             link=f"/admin/agents/host/{h.pk}/change/")
    for g in Gpu.objects.filter(healthy=False, unhealthy_since__isnull=False).select_related("host"):
        yield Occurrence(event=Event.GPU_UNHEALTHY, key=f"gpu:{g.pk}:{g.unhealthy_since:%Y%m%d%H%M%S}",
                         subject=f"GPU {g.index} of {g.host.name} is unhealthy",
                         body=f"GPU {g.pk} (index {g.index}) of host {g.host.name}: "
                              f"{g.unhealthy_reason or 'unhealthy'}. "
                              "It takes no new work until an operator marks it healthy.",
                         link=f"/admin/agents/host/{g.host_id}/change/")
