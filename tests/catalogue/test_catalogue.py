from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region
from gpucloud.catalogue.selectors import price_at
from gpucloud.catalogue.services import price_set

pytestmark = pytest.mark.django_db


def test_seed_catalog_is_realistic_and_idempotent(catalog):
    assert set(GpuModel.objects.values_list("code", flat=True)) == {"H100", "H200", "A100", "L40S", "MI300X"}
    assert GpuModel.objects.get(code="MI300X").vendor == "amd"
    counts = (Region.objects.count(), InstanceType.objects.count(), Price.objects.count())
    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    assert (Region.objects.count(), InstanceType.objects.count(), Price.objects.count()) == counts
    fractions = set(InstanceType.objects.filter(gpu_share_milli__lt=1000).values_list("gpu_share_milli", flat=True))
    assert fractions == {125, 250, 500}


def test_anyone_reads_the_catalogue_with_prices_per_tflops_hour(catalog, anon):
    resp = anon.get("/api/v1/instance-types/h100.8x")
    assert resp.status_code == 200
    body = resp.json()
    assert body["gpus"] == "8.000" and body["gpu_model"]["code"] == "H100"
    assert body["bf16_tflops"] == "7915.2"
    price = next(p for p in body["prices"] if p["region"] == "us-east-1" and p["kind"] == "on_demand")
    assert Decimal(price["per_hour"]) == Decimal("19.9200")  # 8 x $2.49
    expected = (Decimal("19.92") / Decimal("7915.2")).quantize(Decimal("0.000001"))
    assert Decimal(price["per_bf16_tflops_hour"]) == expected
    spot = next(p for p in body["prices"] if p["region"] == "us-east-1" and p["kind"] == "spot")
    assert Decimal(spot["per_hour"]) < Decimal(price["per_hour"])


def test_fractional_type_prices_its_share(catalog, anon):
    body = anon.get("/api/v1/instance-types/l40s.quarter").json()
    assert body["gpus"] == "0.250" and body["gpu_count"] == 1 and body["gpu_share_milli"] == 250
    price = next(p for p in body["prices"] if p["region"] == "us-east-1" and p["kind"] == "on_demand")
    # a quarter of $0.99 with the 10 % sharing premium
    assert Decimal(price["per_hour"]) == Decimal("0.2723")


def test_filters_by_gpu_model_region_and_vendor(catalog, anon):
    codes = {t["code"] for t in anon.get("/api/v1/instance-types", {"gpu_model": "MI300X"}).json()["results"]}
    assert codes == {"mi300x.1x", "mi300x.8x"}
    resp = anon.get("/api/v1/instance-types", {"region": "ap-northeast-1", "page_size": 200})
    tokyo = {t["code"] for t in resp.json()["results"]}
    assert "mi300x.1x" not in tokyo and "h100.1x" in tokyo
    amd = anon.get("/api/v1/gpu-models", {"vendor": "amd"}).json()["results"]
    assert [g["code"] for g in amd] == ["MI300X"]


def test_unknown_instance_type_or_filter_value_is_a_4xx(catalog, anon):
    assert anon.get("/api/v1/instance-types/h900.8x").status_code == 404
    resp = anon.get("/api/v1/prices", {"instance_type": "h900.8x"})
    assert resp.status_code == 400
    assert "instance_type" in resp.json()["error"]["fields"]


def test_instance_type_list_has_constant_query_count(catalog, anon, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.scheduler.fleet import make_hosts

    # count + page + prices + the fleet's capabilities, however many types and prices there are
    with django_assert_max_num_queries(4):
        resp = anon.get("/api/v1/instance-types", {"page_size": 200})
    assert resp.json()["count"] == InstanceType.objects.count()
    # with a fleet, availability adds free capacity and one snapshot per region: not per type
    make_hosts(n=2, model="H100")
    make_hosts(n=1, model="L40S", region="eu-central-1")
    counts = []
    for size in (1, 200):
        with CaptureQueriesContext(connection) as ctx:
            resp = anon.get("/api/v1/instance-types", {"page_size": size, "gpu_model": "H100"})
            assert resp.status_code == 200 and len(resp.json()["results"]) == min(size, 4)
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1], counts


def test_a_price_change_never_rewrites_the_past(catalog):
    it = InstanceType.objects.get(code="h100.1x")
    region = Region.objects.get(code="us-east-1")
    old = price_at(instance_type=it, region=region, kind="on_demand", at=timezone.now())
    change_at = timezone.now() + timedelta(days=1)
    new = price_set(instance_type=it, region=region, kind="on_demand", per_hour=Decimal("1.99"),
                    effective_from=change_at)
    assert new is not None
    old.refresh_from_db()
    assert old.per_hour == Decimal("2.4900")  # the row billed so far is untouched
    assert price_at(instance_type=it, region=region, kind="on_demand", at=timezone.now()).pk == old.pk
    assert price_at(instance_type=it, region=region, kind="on_demand",
                    at=change_at + timedelta(seconds=1)).per_hour == Decimal("1.99")
    # setting the price in force again adds nothing
    assert price_set(instance_type=it, region=region, kind="on_demand", per_hour=Decimal("1.99"),
                     effective_from=change_at + timedelta(hours=1)) is None


def test_database_refuses_negative_prices_and_bad_fractions(catalog):
    it = InstanceType.objects.get(code="h100.1x")
    region = Region.objects.get(code="us-east-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        Price.objects.create(instance_type=it, region=region, kind="spot", per_hour=Decimal("-1"))
    with pytest.raises(IntegrityError), transaction.atomic():
        InstanceType.objects.create(code="bad", name="bad", gpu_model=it.gpu_model, gpu_count=2,
                                    gpu_share_milli=500, vcpus=1, memory_gib=1, disk_gib=1)
