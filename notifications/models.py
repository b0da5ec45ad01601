"""Notifications: one row per event told to one person (their inbox, and the record of what
became of its e-mail and webhook), each person's settings per tenant, and the cursor over the
transition log."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpucloud.tenancy.models import Tenant
from notifications.choices import Delivery, Event, Scope


class Notification(models.Model):
    """One event told to one person, once: `key` names what happened (a transition's id, a
    notice's deadline, a host's outage), unique per person, so a second scan adds nothing."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    # Null for an operator's (a host's events belong to no tenant).
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=32, choices=Event.choices)
    key = models.CharField(max_length=200)
    subject = models.CharField(max_length=300)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=300, blank=True, help_text="the console page it is about")
    in_inbox = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)
    email_status = models.CharField(max_length=16, choices=Delivery.choices, blank=True)
    webhook_status = models.CharField(max_length=16, choices=Delivery.choices, blank=True)
    webhook_attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="notification_once")]
        indexes = [
            models.Index(fields=["user", "tenant", "-created_at"], name="notification_inbox"),
            models.Index(fields=["email_status"], condition=Q(email_status="pending"), name="notification_email_due"),
            models.Index(fields=["webhook_status"], condition=Q(webhook_status="pending"),
                         name="notification_webhook_due"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.event}: {self.subject}"


class NotificationSettings(models.Model):
    """A person's choices in one tenant (tenant null: an operator's, for host events).

    `channels`: {event: [channel, ...]} for the events the person changed; the others follow
    choices.DEFAULT_CHANNELS. The webhook's signing secret is sealed (gpucloud/lib/secretbox.py)
    and shown once, when the URL is set."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.MINE)
    channels = models.JSONField(default=dict, blank=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    webhook_secret_sealed = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="notification_settings_once",
                                               nulls_distinct=False)]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant or 'operations'}"


class NotificationCursor(models.Model):
    """How far the collector has read a source's log (`notifications.sources`)."""

    name = models.CharField(max_length=32, primary_key=True)
    until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name}: until {self.until:%Y-%m-%d %H:%M:%S}"
