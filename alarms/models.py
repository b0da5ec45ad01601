"""Alarms (CloudWatch-style): a metric, a rule, a state, and actions run when the state changes.

    INSUFFICIENT_DATA ──(datapoints)──> OK <──────────> ALARM
            ^                            │                │
            └─────(all datapoints missing, treat_missing_data=missing)

Every change is an `AlarmHistory` row (reason and the datapoints); each action it set off is an
`AlarmAction` row, the delivery log (attempts, outcome, next retry).
"""
from __future__ import annotations

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from alarms.choices import ActionStatus, AlarmState, Comparison, MissingData, Statistic
from alarms.evaluate import period_words
from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet


def _no_actions() -> dict:
    return {"alarm": [], "ok": [], "insufficient_data": []}


class Alarm(models.Model):
    """One alarm of a tenant on one metric of a target (a workload, the tenant, or a kind another app
    registers). `next_eval_at` is the claim: an evaluator takes an alarm only while it is due, under
    its row lock, and moves it on to the next period in the same transaction."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alarms")
    name = models.CharField(max_length=100)
    description = models.CharField(max_length=500, blank=True)
    target_kind = models.CharField(max_length=32)  # alarms.registry: workload, tenant, ...
    target_id = models.CharField(max_length=64, blank=True)  # "" for the tenant
    metric = models.CharField(max_length=32)
    statistic = models.CharField(max_length=8, choices=Statistic.choices, default=Statistic.AVG)
    period = models.PositiveIntegerField(default=60, validators=[MinValueValidator(60), MaxValueValidator(86400)])
    evaluation_periods = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1),
                                                                                 MaxValueValidator(100)])
    datapoints_to_alarm = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    threshold = models.FloatField()
    comparison = models.CharField(max_length=2, choices=Comparison.choices)
    treat_missing_data = models.CharField(max_length=16, choices=MissingData.choices, default=MissingData.MISSING)
    # {"alarm": [action, ...], "ok": [...], "insufficient_data": [...]}; an action is {"type": ..., ...}
    actions = models.JSONField(default=_no_actions)
    enabled = models.BooleanField(default=True, help_text="a disabled alarm is not evaluated")
    # The per-alarm webhook signing secret, encrypted (gpucloud/lib/secretbox.py); shown once, at creation.
    webhook_secret_sealed = models.TextField(blank=True)
    state = models.CharField(max_length=20, choices=AlarmState.choices, default=AlarmState.INSUFFICIENT_DATA)
    state_reason = models.CharField(max_length=1000, default="Not evaluated yet.")
    state_changed_at = models.DateTimeField(default=timezone.now)
    # the last evaluation's datapoints, oldest first: [{"t": iso, "value": float | None}]
    datapoints = models.JSONField(default=list, blank=True)
    # sampled gauges (the tenant's spend rate, queue): [[epoch, value]] of the last N periods
    samples = models.JSONField(default=list, blank=True)
    next_eval_at = models.DateTimeField(default=timezone.now)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name", "created_at"]
        indexes = [models.Index(fields=["next_eval_at"], name="alarm_due", condition=Q(enabled=True))]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="alarm_name_unique"),
            models.CheckConstraint(condition=Q(datapoints_to_alarm__lte=F("evaluation_periods"))
                                   & Q(datapoints_to_alarm__gte=1), name="alarm_m_of_n"),
            models.CheckConstraint(condition=Q(period__gte=60) & Q(period__lte=86400), name="alarm_period_range"),
            models.CheckConstraint(condition=Q(state__in=AlarmState.values), name="alarm_state_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.name}: {self.state}"

    @property
    def period_words(self) -> str:
        return period_words(self.period)


class AlarmHistory(models.Model):
    """A state change of an alarm: from, to, why, and the datapoints it saw."""

    id = models.BigAutoField(primary_key=True)
    alarm = models.ForeignKey(Alarm, on_delete=models.CASCADE, related_name="history")
    created_at = models.DateTimeField(default=timezone.now)
    old_state = models.CharField(max_length=20, choices=AlarmState.choices)
    new_state = models.CharField(max_length=20, choices=AlarmState.choices)
    reason = models.CharField(max_length=1000)
    datapoints = models.JSONField(default=list)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["alarm", "-created_at"], name="alarmhistory_alarm")]

    def __str__(self) -> str:
        return f"{self.alarm_id} {self.old_state} -> {self.new_state} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class AlarmAction(models.Model):
    """One action a state change set off, and its delivery log: created with the history row (in
    the evaluator's transaction), run after commit by a task, retried with backoff while it fails
    in a retryable way. `next_attempt_at` is its claim, as `Alarm.next_eval_at` is the alarm's."""

    id = models.BigAutoField(primary_key=True)
    alarm = models.ForeignKey(Alarm, on_delete=models.CASCADE, related_name="action_runs")
    history = models.ForeignKey(AlarmHistory, on_delete=models.CASCADE, related_name="actions")
    type = models.CharField(max_length=32)
    action = models.JSONField()  # the action as configured at the time
    payload = models.JSONField()  # the event it carries (the webhook body)
    status = models.CharField(max_length=10, choices=ActionStatus.choices, default=ActionStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.CharField(max_length=500, blank=True)
    outcome = models.CharField(max_length=500, blank=True)  # what it did, e.g. "HTTP 204", "stopped"
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["next_attempt_at"], name="alarmaction_due",
                                condition=Q(status=ActionStatus.PENDING))]

    def __str__(self) -> str:
        return f"{self.alarm_id} {self.type} {self.status} ({self.attempts} attempts)"
