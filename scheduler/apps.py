from __future__ import annotations

from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    """Workloads (instances, batch jobs), their lifecycle, and the scheduling loop."""

    name = "scheduler"

    def ready(self) -> None:
        from gpucloud.catalogue import hooks as catalogue_hooks
        from scheduler import hooks, selectors, tasks

        # the Celery side: a cycle after commit (scheduler/hooks.py), looked up at each call
        hooks.on_cycle_wanted(lambda region_id: tasks.trigger_cycle(region_id))
        catalogue_hooks.on_usage(selectors.usage_by_scope)  # quotas beside what the tenant holds
