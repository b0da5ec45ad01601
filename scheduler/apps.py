from __future__ import annotations

from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    """Workloads (instances, batch jobs), their lifecycle, and the scheduling loop."""

    name = "scheduler"
