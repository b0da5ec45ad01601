"""Put back the partial unique index `allocation_one_whole_per_gpu` where 0002 dropped it.

0002 turned off the plain index on `scheduler_allocation.gpu_id` (`db_index=False`). To
drop it, Django looks for any btree index on exactly that column that is not a Meta
index, and on PostgreSQL it found this constraint's partial unique index as well and
dropped both. Django's migration state still lists the constraint, so `makemigrations`
saw nothing wrong; `tests/test_db_constraints.py` now compares every declared constraint and
index with the database. `IF NOT EXISTS` makes this a no-op where the index survived
(SQLite rebuilds the table from the model state and keeps it).
"""
from django.db import migrations

_SQL = (
    'CREATE UNIQUE INDEX IF NOT EXISTS "allocation_one_whole_per_gpu" '
    'ON "scheduler_allocation" ("gpu_id") WHERE ("active" AND "milli" = 1000)'
)


class Migration(migrations.Migration):

    dependencies = [
        ("scheduler", "0003_workload_max_price"),
    ]

    # the index belongs to 0001's constraint: reversing this migration leaves it in place
    operations = [migrations.RunSQL(_SQL, reverse_sql=migrations.RunSQL.noop)]
