"""Revoke the API keys of people who are no longer members of the key's tenant.

Removing a member used to leave their keys unrevoked (only unusable while they were
away), so inviting them back revived every old key. member_remove now revokes them;
this does the same, once, for the members removed before it did.
"""
from __future__ import annotations

from django.db import migrations
from django.db.models import Exists, OuterRef
from django.utils import timezone


def revoke_orphaned_keys(apps, schema_editor):
    ApiKey = apps.get_model("tenancy", "ApiKey")
    AuditEvent = apps.get_model("tenancy", "AuditEvent")
    Membership = apps.get_model("tenancy", "Membership")
    member = Membership.objects.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("created_by_id"))
    orphans = list(ApiKey.objects.filter(revoked_at__isnull=True).exclude(Exists(member)))
    now = timezone.now()
    ApiKey.objects.filter(pk__in=[k.pk for k in orphans]).update(revoked_at=now)
    AuditEvent.objects.bulk_create([
        AuditEvent(tenant_id=k.tenant_id, actor="system", action="api_key.revoke",
                   object_type="apikey", object_id=str(k.pk), object_repr=f"{k.name} ({k.prefix}…)"[:200],
                   data={"reason": "member.remove"}, created_at=now)
        for k in orphans
    ])


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0001_initial")]

    operations = [migrations.RunPython(revoke_orphaned_keys, migrations.RunPython.noop)]
