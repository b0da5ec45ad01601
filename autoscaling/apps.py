from __future__ import annotations

from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """Autoscaling groups of instances, their policies and scheduled actions, and batch pools."""

    name = "autoscaling"

    def ready(self) -> None:
        # Step scaling policies are an alarm action (alarms sits below: it never imports us).
        from autoscaling import alarm_actions

        alarm_actions.register()
        # A batch pool's jobs run only on its members' hosts: the scheduler's snapshot asks us.
        from autoscaling import selectors
        from scheduler import hooks

        hooks.on_queue_confinement(selectors.pool_confinement)
