from __future__ import annotations

from django.apps import AppConfig


class AlarmsConfig(AppConfig):
    """CloudWatch-style alarms on workload and tenant metrics, with e-mail, webhook, stop and scaling actions."""

    name = "alarms"

    def ready(self) -> None:
        # The built-in targets and actions, registered as any other app registers its own
        # (alarms/registry.py): an autoscaling app adds the `scaling_policy` action and a `group` target.
        from alarms import actions, sources

        sources.register_builtin()
        actions.register_builtin()
