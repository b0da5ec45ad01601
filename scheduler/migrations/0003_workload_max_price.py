from django.db import migrations, models


class Migration(migrations.Migration):
    """Spot instances may carry a max price per hour (billing preempts past it)."""

    dependencies = [("scheduler", "0002_lean_indexes")]

    operations = [
        migrations.AddField(
            model_name="workload",
            name="max_price",
            field=models.DecimalField(blank=True, decimal_places=4, max_digits=12, null=True),
        ),
    ]
