"""The saved SSH keys' model moved to tenancy (gpucloud/tenancy/migrations/0005): the console
forgets it here; the table and its rows are tenancy's now (nothing is dropped)."""
from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("frontend", "0001_sshkey"),
        ("tenancy", "0005_sshkey_from_frontend"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="SshKey")],
            database_operations=[],
        ),
    ]
