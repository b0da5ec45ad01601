from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from gpucloud.catalogue.models import GpuModel, Quota, Region

pytestmark = pytest.mark.django_db


def test_plan_default_is_shown_when_no_tenant_wide_row(alice, catalog):
    rows = alice.client().get("/api/v1/quotas").json()
    assert rows == [{"gpu_model": None, "region": None, "max_gpus": 8, "max_instances": 8,
                     "used_gpus": "0.000", "used_instances": 0, "source": "plan"}]


def test_operator_rows_override_and_narrow(alice, charlie, catalog):
    h100 = GpuModel.objects.get(code="H100")
    eu = Region.objects.get(code="eu-central-1")
    Quota.objects.create(tenant=alice.tenant, max_gpus=32, max_instances=10)
    Quota.objects.create(tenant=alice.tenant, gpu_model=h100, max_gpus=8)
    Quota.objects.create(tenant=alice.tenant, gpu_model=h100, region=eu, max_gpus=2)
    Quota.objects.create(tenant=charlie.tenant, max_gpus=1)
    rows = alice.client().get("/api/v1/quotas").json()
    assert [(r["gpu_model"], r["region"], r["max_gpus"], r["source"]) for r in rows] == [
        (None, None, 32, "tenant"), ("H100", None, 8, "tenant"), ("H100", "eu-central-1", 2, "tenant"),
    ]


def test_one_quota_row_per_scope_even_with_nulls(alice, catalog):
    h100 = GpuModel.objects.get(code="H100")
    Quota.objects.create(tenant=alice.tenant, max_gpus=4)
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create(tenant=alice.tenant, max_gpus=5)
    Quota.objects.create(tenant=alice.tenant, gpu_model=h100, max_gpus=4)
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create(tenant=alice.tenant, gpu_model=h100, max_gpus=5)


def test_viewer_reads_quotas_and_anonymous_cannot(victor, anon):
    assert victor.client().get("/api/v1/quotas").status_code == 200
    resp = anon.get("/api/v1/quotas")
    assert resp.status_code in (401, 403)
    assert resp.json()["error"]["code"] == "not_authenticated"
