"""Alarm states and settings, as CloudWatch names them (lower case where CloudWatch's API is camelCase)."""
from __future__ import annotations

from django.db import models


class AlarmState(models.TextChoices):
    OK = "OK", "OK"
    ALARM = "ALARM", "In alarm"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA", "Insufficient data"


class Statistic(models.TextChoices):
    AVG = "avg", "Average"
    MAX = "max", "Maximum"
    MIN = "min", "Minimum"
    P95 = "p95", "95th percentile"
    SUM = "sum", "Sum"


class Comparison(models.TextChoices):
    GT = "gt", ">"
    GE = "ge", ">="
    LT = "lt", "<"
    LE = "le", "<="


class MissingData(models.TextChoices):
    MISSING = "missing", "missing"
    BREACHING = "breaching", "breaching"
    NOT_BREACHING = "not_breaching", "not breaching"
    IGNORE = "ignore", "ignore"


class TargetKind(models.TextChoices):
    """The built-in targets; other apps register more (alarms/registry.py), e.g. an autoscaling group."""

    WORKLOAD = "workload", "one workload"
    TENANT = "tenant", "the tenant"


class ActionStatus(models.TextChoices):
    PENDING = "pending", "pending"  # not run yet, or waiting for its next attempt
    DONE = "done", "done"
    FAILED = "failed", "failed"  # gave up: refused, not retryable, or out of attempts


# actions[...] keys: the state an alarm enters that runs them (CloudWatch's OKActions, AlarmActions,
# InsufficientDataActions)
ACTION_KEYS = {AlarmState.OK: "ok", AlarmState.ALARM: "alarm", AlarmState.INSUFFICIENT_DATA: "insufficient_data"}
