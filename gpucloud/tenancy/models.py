"""Tenants (organisations), their members, invitations, API keys, members' SSH keys and the
audit log."""
from __future__ import annotations

import base64
import binascii
import hashlib
import re
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from gpucloud.tenancy.choices import Plan, Role, TenantStatus


class TenantOwnedQuerySet(models.QuerySet):
    """Every tenant-owned model's manager. Views read rows only through `for_tenant`."""

    def for_tenant(self, tenant: Tenant) -> TenantOwnedQuerySet:
        return self.filter(tenant=tenant)


class Tenant(models.Model):
    """An organisation that rents GPUs. Everything a user creates belongs to one tenant."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)
    plan = models.CharField(max_length=20, choices=Plan.choices, default=Plan.STARTER)
    status = models.CharField(
        max_length=20, choices=TenantStatus.choices, default=TenantStatus.ACTIVE
    )
    suspended_reason = models.CharField(max_length=300, blank=True)
    # Weight in the scheduler's fair share: a tenant of weight 2 gets twice the share.
    fair_share_weight = models.PositiveIntegerField(default=1)
    # Billing's admission facts, pushed down as data (kept by billing.services with every
    # balance and budget change): nothing new may launch, and why (the API's error code).
    # The launch service and the scheduler read them here and import nothing of billing.
    launch_blocked = models.BooleanField(default=False)
    launch_blocked_reason = models.CharField(max_length=32, blank=True)
    # The spent hard-stop budget's name when the reason is budget_exceeded: every face names it.
    launch_blocked_budget = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(fair_share_weight__gte=1), name="tenant_weight_positive"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"

    @property
    def is_suspended(self) -> bool:
        return self.status == TenantStatus.SUSPENDED


class Membership(models.Model):
    """A user's role in a tenant. A user may belong to several tenants."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.tenant.slug}"


class Invitation(models.Model):
    """An invitation to join a tenant. The token is shown once and stored hashed."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Role.choices)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.tenant.slug}"

    def is_open(self, now=None) -> bool:
        now = now or timezone.now()
        return self.accepted_at is None and self.revoked_at is None and self.expires_at > now


class ApiKey(models.Model):
    """A tenant's API key. Only a SHA-256 of the secret is stored; `prefix` finds the row.

    The key acts as its creator, with the creator's current role in the tenant
    narrowed to the key's scopes. Removing a member revokes their keys in the tenant
    (rejoining does not bring them back).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)
    # Requests per minute for this key; empty means the installation's API_RATE_LIMIT.
    rate_limit_per_min = models.PositiveIntegerField(null=True, blank=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


# An OpenSSH public key line, as the launch API takes it inline and the saved keys hold it.
SSH_PUBLIC_KEY = re.compile(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp\d+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( .*)?$")
SSH_PUBLIC_KEY_INVALID = "Not an OpenSSH public key (ssh-ed25519 AAAA… comment)."


class SshKey(models.Model):
    """A member's saved public key within one tenant. Only the public half is ever stored.

    The console offers the keys at launch and the gateway lets them in (for a member who may
    connect). They are the member's standing in the tenant like their API keys: removing the
    member deletes them (tenancy.services.member_remove), so rejoining brings none back.
    The table was the console's (frontend_sshkey) until migration 0005 moved it here.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "user", "name"], name="sshkey_unique_name")]
        verbose_name = "SSH key"

    def __str__(self) -> str:
        return self.name

    @property
    def fingerprint(self) -> str:
        """The key's SHA256 fingerprint as `ssh-keygen -lf` prints it (SHA256:base64, no padding)."""
        return openssh_fingerprint(self.public_key)


def openssh_fingerprint(public_key: str) -> str:
    """SHA256 fingerprint of an OpenSSH public key line; "" when it is not one."""
    parts = public_key.split()
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (IndexError, binascii.Error):
        return ""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class AuditEvent(models.Model):
    """Who did what to which object, when and from where. Append-only."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="audit_events"
    )
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_api_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # A readable name that survives the user's deletion: "alice@example.com via key gpc_ab12".
    actor = models.CharField(max_length=200)
    action = models.CharField(max_length=64, db_index=True)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    data = models.JSONField(default=dict, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action}"


class EmailVerification(models.Model):
    """A self-signed-up user's email address, waiting to be confirmed (or confirmed).

    Sign-up creates the row; the signed link mailed to `email` sets `verified_at` once and
    grants `tenant` its sign-up credit in the same transaction (a guarded UPDATE: a second
    click, or two at once, grant nothing more). Users without a row (made by operators, the
    demo, or before sign-up asked for it) have nothing to confirm.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="email_verification")
    email = models.EmailField(max_length=254)
    # The tenant made at sign-up, whose credit waits for the confirmation.
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    verified_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.email} ({'verified' if self.verified_at else 'unverified'})"
