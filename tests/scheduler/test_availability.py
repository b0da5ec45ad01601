"""Availability first: what would start now, counted by the scheduler itself, and what never could."""
from __future__ import annotations

import pytest
from django.core.management import call_command

from billing.services import spot_prices_update
from gpucloud.catalogue.models import GpuModel, Price
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_instances_api import launch, region_id

pytestmark = pytest.mark.django_db


def _available(actor, **query):
    resp = actor.client().get("/api/v1/availability", query)
    assert resp.status_code == 200, resp.content
    return resp.json()


def _row(rows, instance_type, region="us-east-1"):
    return next(r for r in rows if r["instance_type"] == instance_type and r["region"] == region)


def test_availability_says_k_and_k_of_k_plus_one_launches_start(alice, charlie, catalog):
    make_hosts(n=2, gpus=4)
    launch(charlie, instance_type="h100.2x", name="theirs")
    run_cycle(region_id=region_id())
    row = _row(_available(alice, gpu_model="H100"), "h100.1x")
    k = row["available_now"]
    assert k == 6 and row["can_host"] and row["reason"] == "" and row["gpu_model"] == "H100"
    ids = [launch(alice, instance_type="h100.1x", name=f"n{i}").json()["id"] for i in range(k + 1)]
    run_cycle(region_id=region_id())
    states = sorted(Workload.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == [State.PENDING] + [State.SCHEDULED] * k
    after = _row(_available(alice, instance_type="h100.1x"), "h100.1x")
    assert after["available_now"] == 0 and after["can_host"]
    assert _available(alice, instance_type="h100.1x", available="true") == []


def test_availability_counts_the_queue_ahead(alice, charlie, catalog):
    make_hosts(n=1, gpus=4)
    launch(charlie, instance_type="h100.2x", name="queued")  # pending: no cycle has run yet
    assert _row(_available(alice), "h100.1x")["available_now"] == 2
    assert _row(_available(alice), "h100.4x")["available_now"] == 0


def test_availability_keeps_the_one_tenant_per_gpu_sharing_rule(alice, charlie, catalog):
    make_hosts(n=1, gpus=1, model="L40S")
    launch(charlie, instance_type="l40s.quarter", name="theirs")
    run_cycle(region_id=region_id())
    # the only GPU carries charlie's share: alice may add none, charlie three more quarters
    assert _row(_available(alice), "l40s.quarter")["available_now"] == 0
    assert _row(_available(charlie), "l40s.quarter")["available_now"] == 3
    mine = launch(alice, instance_type="l40s.quarter", name="mine").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=mine).state == State.PENDING
    Workload.objects.filter(pk=mine).delete()
    # an operator opens L40S GPUs to cross-tenant sharing: now alice may share the GPU too
    GpuModel.objects.filter(code="L40S").update(allow_cross_tenant_sharing=True)
    assert _row(_available(alice), "l40s.quarter")["available_now"] == 3


def test_instance_types_carry_availability_per_region_for_anyone(anon, catalog):
    make_hosts(n=1, gpus=8)
    body = anon.get("/api/v1/instance-types/h100.8x").json()
    by_region = {a["region"]: a for a in body["availability"]}
    assert set(by_region) == {p["region"] for p in body["prices"]}
    assert by_region["us-east-1"] == {"region": "us-east-1", "available_now": 1, "can_host": True, "reason": "",
                                      "availability": "available"}
    assert by_region["us-west-2"]["can_host"] is False and by_region["us-west-2"]["available_now"] == 0
    assert by_region["us-west-2"]["reason"] == "the fleet has no H100 GPUs in us-west-2"
    listed = anon.get("/api/v1/instance-types", {"gpu_model": "H100", "region": "us-east-1"}).json()["results"]
    free = {t["code"]: next(a for a in t["availability"] if a["region"] == "us-east-1")["available_now"]
            for t in listed}
    assert free == {"h100.1x": 8, "h100.2x": 4, "h100.4x": 2, "h100.8x": 1}


def test_availability_tells_available_busy_and_never_apart_and_hides_never_on_request(alice, charlie, catalog):
    make_hosts(n=1, gpus=8)
    launch(charlie, instance_type="h100.4x", name="half")
    run_cycle(region_id=region_id())  # 4 of the 8 H100s taken
    rows = _available(alice, gpu_model="H100")
    assert _row(rows, "h100.1x")["availability"] == "available"
    assert (_row(rows, "h100.8x")["available_now"], _row(rows, "h100.8x")["availability"]) == (0, "busy")
    assert (_row(rows, "h100.8x", "us-west-2")["can_host"], _row(rows, "h100.8x", "us-west-2")["availability"]) == (
        False, "never")
    assert {r["availability"] for r in rows} == {"available", "busy", "never"}
    runnable = _available(alice, gpu_model="H100", runnable="true")
    assert runnable and all(r["availability"] != "never" for r in runnable)
    assert len(runnable) == sum(1 for r in rows if r["availability"] != "never")
    # the instance types: the same word per region, and `runnable` leaves out what never could run
    body = alice.client().get("/api/v1/instance-types/h100.8x").json()
    assert {a["region"]: a["availability"] for a in body["availability"]}["us-east-1"] == "busy"
    listed = alice.client().get("/api/v1/instance-types", {"runnable": "true", "page_size": 200}).json()["results"]
    assert {t["code"] for t in listed} == {"h100.1x", "h100.2x", "h100.4x", "h100.8x"}
    for t in listed:
        assert {a["region"] for a in t["availability"]} == {p["region"] for p in t["prices"]} == {"us-east-1"}
        assert all(a["availability"] != "never" for a in t["availability"])
    everything = alice.client().get("/api/v1/instance-types", {"page_size": 200}).json()["results"]
    assert len(everything) > len(listed)


def test_availability_is_for_members_and_refuses_unknown_parameters(alice, anon, catalog):
    assert anon.get("/api/v1/availability").status_code in (401, 403)
    resp = alice.client().get("/api/v1/availability", {"available": "perhaps"})
    assert resp.status_code == 400 and "available" in resp.json()["error"]["fields"]
    assert alice.client().get("/api/v1/availability", {"gpus": "8"}).status_code == 400


def test_seed_catalog_again_after_the_spot_market_moved_adds_no_prices(catalog):
    spot_prices_update()  # an empty fleet: spot falls to its floor, a new row per offer
    before = Price.objects.count()
    call_command("seed_catalog", stdout=open("/dev/null", "w"))  # the demo restarts
    assert Price.objects.count() == before
    spot_prices_update()
    assert Price.objects.count() == before
