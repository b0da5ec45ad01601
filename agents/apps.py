from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The control-plane side of host agents: registration, heartbeats, desired state."""

    name = "agents"

    def ready(self) -> None:
        from agents import fastpath, selectors
        from gpucloud.catalogue import hooks as catalogue_hooks
        from scheduler import hooks

        # a workload's hosts answer heartbeats differently now: drop their cached answers, wake them
        hooks.on_holding_changed(lambda ids: fastpath.workloads_changed(workload_ids=ids))
        # the instance types' API shows what the fleet would start now (the catalogue sits below)
        catalogue_hooks.on_availability(selectors.availability)
