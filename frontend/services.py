"""Writes for the console's own rows, audited like every other service."""
from __future__ import annotations

from django.db import transaction
from rest_framework import serializers

from frontend.models import SshKey
from gpucloud.lib.errors import Conflict, InvalidInput
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.models import Membership
from scheduler.api.serializers import WorkloadCreateSerializer


@transaction.atomic
def ssh_key_add(*, membership: Membership, name: str, public_key: str) -> SshKey:
    """Save a public key; it must be one the launch API would accept."""
    try:
        # The launch API's own check, so a saved key is never refused at launch.
        (key,) = WorkloadCreateSerializer().validate_ssh_keys([public_key.strip()])
    except serializers.ValidationError as exc:
        raise InvalidInput(str(exc.detail[0]), fields={"public_key": [str(d) for d in exc.detail]}) from None
    name = name.strip()
    if SshKey.objects.filter(tenant=membership.tenant, user=membership.user, name=name).exists():
        raise Conflict(f"You already have a key named {name!r}.", fields={"name": ["Already in use."]})
    row = SshKey.objects.create(tenant=membership.tenant, user=membership.user, name=name, public_key=key)
    audit_record(tenant=membership.tenant, action="ssh_key.create", obj=row, object_repr=name)
    return row


@transaction.atomic
def ssh_key_remove(*, key: SshKey) -> None:
    audit_record(tenant=key.tenant, action="ssh_key.delete", obj=key, object_repr=key.name)
    key.delete()
