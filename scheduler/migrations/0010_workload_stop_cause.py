import re

from django.db import migrations, models

# The countdown the notice givers used to append to the reason (before stop_cause existed).
_COUNTDOWN = re.compile(r"; (?:stops in|stopping at) .*$")


def causes_from_reasons(apps, schema_editor):
    """Notices running during the upgrade: their cause is their reason without the countdown."""
    Workload = apps.get_model("scheduler", "Workload")
    holding = ["scheduled", "starting", "running", "stopping"]
    for pk, reason in Workload.objects.filter(stop_by__isnull=False, state__in=holding).values_list("pk", "reason"):
        Workload.objects.filter(pk=pk).update(stop_cause=_COUNTDOWN.sub("", reason)[:500])


class Migration(migrations.Migration):
    """A preemption notice's cause, kept as data beside `stop_by` (scheduler/notice.py)."""

    dependencies = [
        ('scheduler', '0009_workload_checkpoint_preempt_cap'),
    ]

    operations = [
        migrations.AddField(
            model_name='workload',
            name='stop_cause',
            field=models.CharField(blank=True, max_length=500),
        ),
        migrations.RunPython(causes_from_reasons, migrations.RunPython.noop),
    ]
