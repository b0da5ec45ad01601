from __future__ import annotations

from django.apps import AppConfig


class FrontendConfig(AppConfig):
    """The web console."""

    name = "frontend"
