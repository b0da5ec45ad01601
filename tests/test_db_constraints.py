"""The database holds every constraint and index the models declare.

Django's migration state can say a constraint exists while the database lacks it (an
`AlterField` once dropped a partial unique index as a side effect), and `makemigrations`
cannot see that. The guards the scheduler relies on live in these constraints.
"""
from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection


@pytest.mark.django_db
def test_every_declared_constraint_and_index_exists_in_the_database():
    missing = []
    with connection.cursor() as cur:
        for model in apps.get_models():
            if not model._meta.managed or model._meta.proxy:
                continue
            present = connection.introspection.get_constraints(cur, model._meta.db_table)
            missing += [f"{model._meta.db_table}.{c.name}"
                        for c in [*model._meta.constraints, *model._meta.indexes] if c.name not in present]
    assert missing == []


@pytest.mark.django_db
def test_a_gpu_cannot_hold_two_active_whole_allocations(alice, catalog):
    from django.db import IntegrityError, transaction

    from agents.models import Gpu
    from scheduler.models import Allocation, Workload
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1)
    ids = [alice.client().post("/api/v1/instances", {
        "name": f"w{i}", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
    }, format="json").json()["id"] for i in range(2)]
    first, second = (Workload.objects.get(pk=pk) for pk in ids)
    gpu = Gpu.objects.first()
    Allocation.objects.create(gpu=gpu, host=gpu.host, workload=first, milli=1000)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(gpu=gpu, host=gpu.host, workload=second, milli=1000)
    Allocation.objects.filter(workload=first).update(active=False)  # released: the GPU may be booked again
    Allocation.objects.create(gpu=gpu, host=gpu.host, workload=second, milli=1000)
