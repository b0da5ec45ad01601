"""Saved SSH keys move from the console's app (frontend_sshkey) to tenancy (tenancy_sshkey).

The gateway authorises with them and member removal deletes them, so they belong with the
members and API keys; the rows stay as they are (the model moves in Django's state, the table
is renamed). Keys of people who are no longer members of the key's tenant are deleted once
here: removal left them behind before, and rejoining would have let them in again
(tenancy.services.member_remove deletes them from now on).
"""
from __future__ import annotations

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.db.models import Exists, OuterRef
from django.utils import timezone


def delete_orphaned_ssh_keys(apps, schema_editor):
    SshKey = apps.get_model("tenancy", "SshKey")
    AuditEvent = apps.get_model("tenancy", "AuditEvent")
    Membership = apps.get_model("tenancy", "Membership")
    member = Membership.objects.filter(tenant_id=OuterRef("tenant_id"), user_id=OuterRef("user_id"))
    orphans = list(SshKey.objects.exclude(Exists(member)).order_by("pk"))
    now = timezone.now()
    AuditEvent.objects.bulk_create([
        AuditEvent(tenant_id=k.tenant_id, actor="system", action="ssh_key.delete", object_type="sshkey",
                   object_id=str(k.pk), object_repr=k.name[:200], data={"reason": "member.remove"}, created_at=now)
        for k in orphans
    ])
    SshKey.objects.filter(pk__in=[k.pk for k in orphans]).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("tenancy", "0004_tenant_launch_blocked"),
        ("frontend", "0001_sshkey"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="SshKey",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                                   verbose_name="ID")),
                        ("name", models.CharField(max_length=100)),
                        ("public_key", models.TextField()),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                                     to="tenancy.tenant")),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+",
                                                   to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        "verbose_name": "SSH key",
                        "ordering": ["name", "id"],
                        "constraints": [models.UniqueConstraint(fields=("tenant", "user", "name"),
                                                                name="sshkey_unique_name")],
                        "db_table": "frontend_sshkey",
                    },
                ),
            ],
            database_operations=[],
        ),
        # The table takes tenancy's name (renamed in place: rows, ids and constraints kept).
        migrations.AlterModelTable(name="sshkey", table=None),
        migrations.RunPython(delete_orphaned_ssh_keys, migrations.RunPython.noop),
    ]
