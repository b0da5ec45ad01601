# Billing's admission facts move onto the tenant row (Tenant.launch_blocked): fill it for
# the accounts that exist, with the rule of billing.services.launch_block.

from django.db import migrations


def push_down(apps, schema_editor):
    Account = apps.get_model("billing", "Account")
    Tenant = apps.get_model("tenancy", "Tenant")
    for tenant_id, balance, budget_blocked in Account.objects.values_list("tenant_id", "balance", "budget_blocked"):
        reason = "insufficient_credit" if balance <= 0 else "budget_exceeded" if budget_blocked else ""
        if reason:
            Tenant.objects.filter(pk=tenant_id).update(launch_blocked=True, launch_blocked_reason=reason)


class Migration(migrations.Migration):

    dependencies = [
        ("billing", "0001_initial"),
        ("tenancy", "0004_tenant_launch_blocked"),
    ]

    operations = [
        migrations.RunPython(push_down, migrations.RunPython.noop),
    ]
