from __future__ import annotations

from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """Autoscaling groups of instances, their policies and scheduled actions, and batch pools."""

    name = "autoscaling"
