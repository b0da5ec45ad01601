from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    """What happened to a person's work, told the way they chose: console inbox, e-mail, webhook."""

    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"
