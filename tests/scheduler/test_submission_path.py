"""The cheap submission path answers what the expensive one did.

A launch's 201 is built from what the launch wrote and read (no read-back of the workload, its
events and its cost): it must equal what a GET of the same workload answers right after. The
quota ceiling reads only the limits: a rule narrowed to a model or region, a tenant-wide row,
and the plan's default where there is none refuse as before.
"""
from __future__ import annotations

import pytest

from gpucloud.catalogue.models import GpuModel, Quota, Region


@pytest.fixture
def catalogue(db):
    """A slice of seed_catalog (whose prices cost seconds per test): H100 in three regions,
    H200 in one, on demand and spot."""
    from decimal import Decimal

    from django.utils import timezone

    from gpucloud.catalogue.models import InstanceType, Price

    regions = {code: Region.objects.create(code=code, name=code, country="US")
               for code in ("us-east-1", "us-west-2", "ap-northeast-1")}
    since = timezone.now() - timezone.timedelta(days=1)
    for model_code, counts, offered in (("H100", (1, 4, 8), list(regions)), ("H200", (1,), ["us-east-1"])):
        model = GpuModel.objects.create(code=model_code, name=model_code, vendor="nvidia", memory_gib=80,
                                        bf16_tflops=Decimal("989.4"), interconnect="NVLink")
        for n in counts:
            it = InstanceType.objects.create(code=f"{model_code.lower()}.{n}x", name=f"{n}x {model_code}",
                                             gpu_model=model, gpu_count=n, vcpus=24 * n, memory_gib=240 * n,
                                             disk_gib=100)
            for code in offered:
                for kind, per_hour in (("on_demand", "2.49"), ("spot", "1.12")):
                    Price.objects.create(instance_type=it, region=regions[code], kind=kind,
                                         per_hour=Decimal(per_hour) * n, effective_from=since)
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=2)  # a launch no host could ever run is refused (unsatisfiable); 2: a 2-host gang
    make_hosts(n=1, region="us-west-2")


def _body(**extra):
    return {"name": "j", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox", **extra}


@pytest.mark.parametrize("kind, extra", [
    ("jobs", {"command": ["true"], "env": {"A": "1"}, "max_retries": 2, "timeout_s": 60, "queue": "q-1"}),
    ("jobs", {"instance_type": "h100.4x", "nodes": 2, "priority": "low"}),
    ("jobs", {"billing": "spot", "max_price": "99.5"}),
    ("instances", {"ports": [8888], "auto_stop_idle_minutes": 30}),
])
def test_the_201_equals_a_get_right_after(catalogue, alice, kind, extra):
    c = alice.client()
    created = c.post(f"/api/v1/{kind}", _body(**extra), format="json")
    assert created.status_code == 201, created.content
    got = c.get(f"/api/v1/{kind}/{created.json()['id']}")
    assert got.status_code == 200
    assert created.json() == got.json()
    assert created.json()["hourly_cost"] is not None and created.json()["cost_so_far"] == "0.00"


def test_the_quota_ceiling_refuses_as_before(catalogue, alice):
    c = alice.client()
    # the plan's default (starter: 8 GPUs) when there is no tenant-wide row
    r = c.post("/api/v1/jobs", _body(instance_type="h100.8x", nodes=2), format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "quota_exceeded"
    # a tenant-wide row replaces the plan's default
    Quota.objects.create(tenant=alice.tenant, max_gpus=16)
    assert c.post("/api/v1/jobs", _body(instance_type="h100.8x", nodes=2), format="json").status_code == 201
    # a rule narrowed to a model and region applies to that model in that region only
    Quota.objects.create(tenant=alice.tenant, gpu_model=GpuModel.objects.get(code="H100"),
                         region=Region.objects.get(code="us-east-1"), max_gpus=4)
    r = c.post("/api/v1/jobs", _body(instance_type="h100.8x"), format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "quota_exceeded"
    assert "H100 GPUs in us-east-1" in r.json()["error"]["message"]
    assert c.post("/api/v1/jobs", _body(instance_type="h100.8x", region="us-west-2"),
                  format="json").status_code == 201


@pytest.mark.parametrize("extra, code", [
    ({"instance_type": "nope.1x"}, "unknown_instance_type"),
    ({"region": "nowhere-1"}, "unknown_region"),
    ({"instance_type": "h200.1x", "region": "ap-northeast-1"}, "not_offered"),
])
def test_the_refusals_of_type_region_and_offer_are_unchanged(catalogue, alice, extra, code):
    from scheduler.models import Workload

    r = alice.client().post("/api/v1/jobs", _body(**extra), format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == code, r.content
    assert not Workload.objects.exists()


# Authentication (the key with its tenant, creator and membership: 1), the price in force with
# type and region (1), the quota limits (1), the fleet's hosts of that model (1), the three
# INSERTs (workload, its event, the audit event) and the transaction's savepoint and release (2,
# the test's own transaction makes the launch's a savepoint). docs/benchmarks.md, "End to end".
LAUNCH_QUERIES = 9


@pytest.mark.parametrize("kind, extra", [("jobs", {"command": ["true"]}), ("instances", {"ports": [8888]})])
def test_a_launch_costs_a_fixed_number_of_queries(catalogue, alice, kind, extra, django_assert_num_queries):
    c = alice.client()
    assert c.post(f"/api/v1/{kind}", _body(**extra), format="json").status_code == 201  # the key's use recorded
    with django_assert_num_queries(LAUNCH_QUERIES) as ctx:
        r = c.post(f"/api/v1/{kind}", _body(**extra), format="json")
    assert r.status_code == 201, r.content
    sql = [q["sql"] for q in ctx.captured_queries]
    assert [s.split()[0] for s in sql].count("INSERT") == 3
    # the same with a second quota rule and a second host: no query per row
    Quota.objects.create(tenant=alice.tenant, gpu_model=GpuModel.objects.get(code="H100"), max_gpus=64)
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1)
    with django_assert_num_queries(LAUNCH_QUERIES):
        assert c.post(f"/api/v1/{kind}", _body(**extra), format="json").status_code == 201
