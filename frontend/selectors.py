"""Reads for the console's own rows. Tenant-owned rows only through `tenant=`."""
from __future__ import annotations

from django.db.models import QuerySet

from frontend.models import SshKey
from gpucloud.tenancy.models import Tenant


def ssh_key_list(*, tenant: Tenant, user) -> QuerySet[SshKey]:
    """The signed-in user's saved keys in this tenant (keys are personal, not shared)."""
    return SshKey.objects.for_tenant(tenant).filter(user=user)
