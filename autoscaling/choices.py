from __future__ import annotations

from django.db import models


class PolicyKind(models.TextChoices):
    TARGET_TRACKING = "target_tracking", "Target tracking"
    STEP = "step", "Step scaling"


class PolicyMetric(models.TextChoices):
    GPU_UTIL = "gpu_util", "Average GPU utilisation of the members (%)"
    QUEUE_BACKLOG = "queue_backlog_per_instance", "Queued jobs per instance"


class AdjustmentType(models.TextChoices):
    CHANGE = "change_in_capacity", "Change in capacity"
    EXACT = "exact_capacity", "Exact capacity"
    PERCENT = "percent_change_in_capacity", "Percent change in capacity"


class ActivityKind(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled action"
    SCALE_OUT = "scale_out", "Scale out"
    SCALE_IN = "scale_in", "Scale in"
    STEP = "step", "Step scaling"
    REPLACE = "replace", "Health replacement"
    LAUNCH = "launch", "Launch"
    TERMINATE = "terminate", "Terminate"
    LAUNCH_FAILED = "launch_failed", "Launch failed"
    UPDATE = "update", "Updated"
    NOTE = "note", "Note"
