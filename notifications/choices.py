"""The events a person can be told of, the channels, and each event's default channels.

Defaults keep the inbox for everything and e-mail for what needs a person soon (a failure, a
notice, a container lost, a host down). Idle auto-stop, budget thresholds and the low balance
already e-mail the tenant's owners and admins from their own apps (scheduler.autostop,
billing.alerts); their e-mail here starts off so nobody gets the same mail twice, and a person
who wants it on (or off elsewhere) says so in their settings.
"""
from __future__ import annotations

from typing import Final

from django.db import models


class Event(models.TextChoices):
    INSTANCE_RUNNING = "instance.running", "Instance running"
    INSTANCE_STOPPED = "instance.stopped", "Instance stopped"
    INSTANCE_FAILED = "instance.failed", "Instance failed or lost"
    JOB_SUCCEEDED = "job.succeeded", "Job finished"
    JOB_FAILED = "job.failed", "Job failed or lost"
    NOTICE = "workload.notice", "Preemption notice"
    IDLE_STOPPED = "instance.idle_stopped", "Idle auto-stop"
    CONTAINER_LOST = "container.lost", "Container lost or restarted"
    BUDGET = "budget.threshold", "Budget threshold crossed"
    LOW_BALANCE = "balance.low", "Low balance"
    # operators only (staff): no tenant
    HOST_DOWN = "host.down", "Host down"
    HOST_LOST = "host.lost", "Host lost (its work given up)"
    GPU_UNHEALTHY = "host.unhealthy", "GPU unhealthy"


OPERATOR_EVENTS: Final = frozenset({Event.HOST_DOWN, Event.HOST_LOST, Event.GPU_UNHEALTHY})
# Told to the tenant's owners and admins, whoever launched what.
TENANT_EVENTS: Final = frozenset({Event.BUDGET, Event.LOW_BALANCE})
WORKLOAD_EVENTS: Final = frozenset(set(Event) - OPERATOR_EVENTS - TENANT_EVENTS)


class Channel(models.TextChoices):
    INBOX = "inbox", "Console inbox"
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook"


INBOX, EMAIL, WEBHOOK = Channel.INBOX.value, Channel.EMAIL.value, Channel.WEBHOOK.value

DEFAULT_CHANNELS: Final[dict[str, tuple[str, ...]]] = {
    Event.INSTANCE_RUNNING: (INBOX,),
    Event.INSTANCE_STOPPED: (INBOX,),
    Event.INSTANCE_FAILED: (INBOX, EMAIL),
    Event.JOB_SUCCEEDED: (INBOX,),
    Event.JOB_FAILED: (INBOX, EMAIL),
    Event.NOTICE: (INBOX, EMAIL),
    Event.IDLE_STOPPED: (INBOX,),
    Event.CONTAINER_LOST: (INBOX, EMAIL),
    Event.BUDGET: (INBOX,),
    Event.LOW_BALANCE: (INBOX,),
    Event.HOST_DOWN: (INBOX, EMAIL),
    Event.HOST_LOST: (INBOX, EMAIL),
    Event.GPU_UNHEALTHY: (INBOX, EMAIL),
}


class Scope(models.TextChoices):
    """Whose workloads' events a member hears of."""

    MINE = "mine", "Work I launched"
    ALL = "all", "All of the tenant's work"


class Delivery(models.TextChoices):
    NONE = "", "Not asked"
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"
    RATE_LIMITED = "rate_limited", "Held back (rate limit)"
    REFUSED = "refused", "Refused (the URL may not be called)"
