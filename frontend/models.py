"""The console's own rows: saved SSH public keys, offered on the launch page.

The API takes keys inline (`ssh_keys` on a launch); saving them is a console convenience,
so the model lives here rather than in tenancy.
"""
from __future__ import annotations

import base64
import binascii
import hashlib

from django.conf import settings
from django.db import models
from django.utils import timezone

from gpucloud.tenancy.models import Tenant, TenantOwnedQuerySet


class SshKey(models.Model):
    """A user's public key within one tenant. Only the public half is ever stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    objects = TenantOwnedQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["tenant", "user", "name"], name="sshkey_unique_name")]

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
