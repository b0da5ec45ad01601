from __future__ import annotations

from django.db import models


class HostState(models.TextChoices):
    READY = "ready", "Ready"  # heartbeating; takes new work
    DRAINING = "draining", "Draining"  # heartbeating; keeps its work, takes no new work
    DOWN = "down", "Down"  # missed heartbeats; its work is LOST after the grace period
