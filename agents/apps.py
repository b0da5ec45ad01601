from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The control-plane side of host agents: registration, heartbeats, desired state."""

    name = "agents"

    def ready(self) -> None:
        from agents import fastpath, selectors
        from agents.api import workloads
        from gpucloud.catalogue import hooks as catalogue_hooks
        from scheduler import hooks
        from scheduler.api import contributors

        # a workload's hosts answer heartbeats differently now: drop their cached answers, wake them
        hooks.on_holding_changed(lambda ids, hosts: fastpath.workloads_changed(workload_ids=ids, hosts=hosts))
        # the instance types' API shows what the fleet would start now (the catalogue sits below)
        catalogue_hooks.on_availability(selectors.availability)
        # the instances' and jobs' resources show their GPUs' metrics and log tails (the scheduler sits below)
        contributors.on_gpu_metrics(workloads.gpu_metrics)
        contributors.on_logs(workloads.logs)
