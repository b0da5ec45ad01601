from __future__ import annotations

import pytest

from agents.models import Gpu
from gpucloud.catalogue.models import GpuModel, Quota
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db

BODY = {"name": "train-1", "instance_type": "h100.1x", "region": "us-east-1", "image": "pytorch/pytorch:2.4.0",
        "billing": "on_demand", "priority": "standard"}


def launch(actor, url="/api/v1/instances", **over):
    return actor.client().post(url, {**BODY, **over}, format="json")


def region_id(code="us-east-1"):
    from gpucloud.catalogue.models import Region

    return Region.objects.get(code=code).pk


def test_launch_answers_pending_then_the_cycle_places_it(alice, catalog):
    make_hosts(n=2)
    resp = launch(alice, instance_type="h100.4x", command="nvidia-smi && sleep infinity",
                  env={"WANDB_MODE": "offline"}, ports=[8888], ssh_keys=["ssh-ed25519 AAAAC3Nza alice@laptop"])
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["state"] == "pending" and body["gpus"] == [] and body["command"][:2] == ["/bin/sh", "-c"]
    stats = run_cycle(region_id=region_id())
    assert stats.apply.placed == 1
    detail = alice.client().get(f"/api/v1/instances/{body['id']}").json()
    assert detail["state"] == "scheduled"
    assert len(detail["gpus"]) == 4 and detail["host"]
    # four GPUs on one NVLink island of one host
    gpus = Gpu.objects.filter(uuid__in=detail["gpus"])
    assert len({g.host_id for g in gpus}) == 1 and len({g.nvlink_island for g in gpus}) == 1
    assert all(g.whole and g.used_milli == 1000 for g in gpus)
    assert [e["to_state"] for e in detail["events"]] == ["pending", "scheduled"]


def test_fractional_instances_share_one_gpu_never_with_whole_work(alice, catalog):
    make_hosts(n=1, gpus=2, model="L40S", islands=1)
    ids = [launch(alice, instance_type="l40s.quarter", name=f"nb-{i}").json()["id"] for i in range(4)]
    whole = launch(alice, instance_type="l40s.1x", name="whole").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.filter(pk__in=[*ids, whole], state=State.SCHEDULED).count() == 5
    shared = {a.gpu_id for a in Allocation.objects.filter(workload_id__in=ids, active=True)}
    assert len(shared) == 1
    gpu = Gpu.objects.get(uuid=next(iter(shared)))
    assert gpu.used_milli == 1000 and not gpu.whole
    assert Allocation.objects.get(workload_id=whole, active=True).gpu_id not in shared


def test_stop_frees_the_gpus_and_delete_hides_it(alice, catalog):
    make_hosts(n=1)
    wid = launch(alice, instance_type="h100.8x").json()["id"]
    run_cycle(region_id=region_id())
    assert Gpu.objects.filter(used_milli=1000).count() == 8
    resp = alice.client().post(f"/api/v1/instances/{wid}/stop")
    assert resp.status_code == 200 and resp.json()["state"] == "stopped"
    assert Gpu.objects.filter(used_milli__gt=0).count() == 0
    assert not Allocation.objects.filter(active=True).exists()
    # stopping again is harmless
    assert alice.client().post(f"/api/v1/instances/{wid}/stop").json()["state"] == "stopped"
    assert alice.client().delete(f"/api/v1/instances/{wid}").status_code == 204
    assert alice.client().get(f"/api/v1/instances/{wid}").status_code == 404
    assert Workload.objects.filter(pk=wid).exists()  # billing keeps the row


def test_waiting_reason_names_the_quota(alice, catalog):
    make_hosts(n=2)
    Quota.objects.create(tenant=alice.tenant, gpu_model=GpuModel.objects.get(code="H100"), max_gpus=8)
    first = launch(alice, instance_type="h100.8x").json()["id"]
    second = launch(alice, instance_type="h100.1x", name="more").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=first).state == State.SCHEDULED
    detail = alice.client().get(f"/api/v1/instances/{second}").json()
    assert detail["state"] == "pending"
    assert detail["reason"] == "quota: 8 of 8 H100 GPUs in use and this needs 1 more"
    quotas = alice.client().get("/api/v1/quotas").json()
    h100 = next(q for q in quotas if q["gpu_model"] == "H100")
    assert h100["used_gpus"] == "8.000" and h100["max_gpus"] == 8


def test_waiting_reason_names_capacity_and_queue_position(alice, bob, charlie, catalog):
    make_hosts(n=1, gpus=8, islands=2)
    launch(charlie, instance_type="h100.8x", name="big").json()
    run_cycle(region_id=region_id())
    a = launch(alice, instance_type="h100.4x", name="a").json()["id"]
    b = launch(bob, instance_type="h100.4x", name="b").json()["id"]
    run_cycle(region_id=region_id())
    wa, wb = Workload.objects.get(pk=a), Workload.objects.get(pk=b)
    assert wa.state == wb.state == State.PENDING
    assert "4" in wa.reason and "H100" in wa.reason, wa.reason
    assert sorted([wa.queue_position, wb.queue_position]) == [1, 2]
    later = wa if wa.queue_position == 2 else wb
    assert "1 request ahead of you" in later.reason


def test_unknown_instance_type_region_or_offer_is_a_4xx_and_writes_nothing(alice, catalog):
    before = Workload.objects.count()
    for over, field in [({"instance_type": "h900.8x"}, "instance_type"), ({"region": "mars-1"}, "region"),
                        ({"instance_type": "mi300x.1x", "region": "ap-northeast-1"}, "instance_type"),
                        ({"billing": "free"}, "billing"), ({"priority": "urgent"}, "priority"),
                        ({"image": "Not An Image!"}, "image"), ({"ports": [0]}, "ports"),
                        ({"env": {"1BAD": "x"}}, "env"), ({"ssh_keys": ["hello"]}, "ssh_keys"),
                        ({"gpus": 8}, "gpus"), ({"name": "x" * 101}, "name")]:
        resp = launch(alice, **over)
        assert resp.status_code == 400, (over, resp.json())
        assert field in resp.json()["error"]["fields"], (over, resp.json())
    assert Workload.objects.count() == before


def test_viewer_cannot_launch_and_suspended_tenant_cannot_launch(alice, victor, catalog):
    assert launch(victor).status_code == 403
    from gpucloud.tenancy.services import tenant_suspend

    tenant_suspend(tenant=alice.tenant, reason="unpaid")
    resp = launch(alice)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "tenant_suspended"
    assert alice.client().get("/api/v1/instances").status_code == 200
    assert not Workload.objects.exists()


def test_more_gpus_than_the_quota_allows_is_refused_at_once(alice, catalog):
    resp = launch(alice, url="/api/v1/jobs", instance_type="h100.8x", nodes=2)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "quota_exceeded"
    assert "16 GPUs" in resp.json()["error"]["message"]
    assert not Workload.objects.exists()


def test_jobs_have_their_own_route_and_fields(alice, catalog):
    make_hosts(n=2)
    type(alice.tenant).objects.filter(pk=alice.tenant.pk).update(plan="team")
    resp = launch(alice, url="/api/v1/jobs", instance_type="h100.8x", nodes=2, max_retries=3, timeout_s=3600,
                  queue="research")
    assert resp.status_code == 201, resp.json()
    job = resp.json()
    assert job["kind"] == "job" and job["nodes"] == 2 and job["max_retries"] == 3
    assert alice.client().get(f"/api/v1/instances/{job['id']}").status_code == 404
    run_cycle(region_id=region_id())
    detail = alice.client().get(f"/api/v1/jobs/{job['id']}").json()
    assert detail["state"] == "scheduled" and len(detail["hosts"]) == 2 and len(detail["gpus"]) == 16


def test_list_query_count_is_constant(alice, catalog, django_assert_max_num_queries):
    make_hosts(n=2)
    type(alice.tenant).objects.filter(pk=alice.tenant.pk).update(plan="team")
    for i in range(12):
        launch(alice, name=f"w{i}")
    run_cycle(region_id=region_id())
    with django_assert_max_num_queries(8):
        results = alice.client().get("/api/v1/instances").json()["results"]
    assert len(results) == 12 and all(r["gpus"] for r in results)
