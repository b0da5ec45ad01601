from __future__ import annotations

from django.db import models

from gpucloud.catalogue.choices import PriceKind


class WorkloadKind(models.TextChoices):
    INSTANCE = "instance", "Instance"  # interactive rental, runs until stopped
    JOB = "job", "Batch job"  # runs to completion, may retry


class State(models.TextChoices):
    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    PREEMPTED = "preempted", "Preempted"
    LOST = "lost", "Lost"


# States that hold GPUs (an allocation exists).
HOLDING = frozenset({State.SCHEDULED, State.STARTING, State.RUNNING, State.STOPPING})
ACTIVE = HOLDING | {State.PENDING}
TERMINAL = frozenset({State.STOPPED, State.SUCCEEDED, State.FAILED, State.PREEMPTED, State.LOST})


class PriorityClass(models.TextChoices):
    CRITICAL = "critical", "Critical"
    STANDARD = "standard", "Standard"
    LOW = "low", "Low"


# A workload is billed at the price of its kind: the catalogue's on-demand or spot price.
Billing = PriceKind


class SchedulingMode(models.TextChoices):
    STATIC = "static", "Static"
    DYNAMIC = "dynamic", "Dynamic"
    HYBRID = "hybrid", "Hybrid"
