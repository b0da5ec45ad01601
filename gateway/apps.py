from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """SSH and HTTP into instances through the agents' tunnels (`python -m gateway`); one model: the
    web terminal's one-time tickets (gateway/models.py)."""

    name = "gateway"

    def ready(self) -> None:
        from gateway import public
        from scheduler.api import contributors

        # the scheduler sits below: its instances' resource shows how to reach them through us
        contributors.on_connect(public.connect_hints)
