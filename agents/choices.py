from __future__ import annotations

from django.db import models


class HostState(models.TextChoices):
    """What a host does now.

        READY ──cordon──▶ CORDONED ──drain──▶ DRAINING        (operator, admin actions)
          ▲                  │                    │
          └──── uncordon ────┴────────────────────┘
        any ──silent > HOST_DOWN_AFTER_S──▶ DOWN ──heartbeat──▶ Host.admin_state

    DOWN is the only state the liveness task sets; the operator's choice is kept in
    `Host.admin_state`, so a draining host that goes DOWN and comes back is DRAINING again.
    """

    READY = "ready", "Ready"  # heartbeating; takes new work
    CORDONED = "cordoned", "Cordoned"  # heartbeating; keeps its work, takes no new work
    DRAINING = "draining", "Draining"  # like CORDONED, and restartable batch jobs are requeued after a notice
    DOWN = "down", "Down"  # missed heartbeats; its work is LOST after the grace period


class AdminState(models.TextChoices):
    """What the operator wants of a host; what it returns to after being DOWN."""

    READY = "ready", "Ready"
    CORDONED = "cordoned", "Cordoned"
    DRAINING = "draining", "Draining"
