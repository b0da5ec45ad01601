from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The control-plane side of host agents: registration, heartbeats, desired state."""

    name = "agents"
