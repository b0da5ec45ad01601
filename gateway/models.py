"""The web terminal's tickets: one row per ticket the console issued and the gateway has not used.

A row, not a signed token: the web tier and the gateway are separate processes (and the
gateway has replicas), and the demo has no shared cache, so "used once" needs a place both
see; the database is the one every deployment has. The ticket itself is never stored, only
its SHA-256; the session it is bound to is sealed (gpucloud.lib.secretbox).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class TerminalTicket(models.Model):
    digest = models.CharField(max_length=64, primary_key=True)  # sha256 hex of the ticket
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    workload = models.ForeignKey("scheduler.Workload", on_delete=models.CASCADE, related_name="+")
    session_sealed = models.TextField()  # the console session's key, sealed: signing out ends the ticket
    origin = models.CharField(max_length=300)  # scheme://host[:port] of the console page that asked for it
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"terminal ticket of user {self.user_id} for {self.workload_id}"
