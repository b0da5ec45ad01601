"""Volumes through the API: the lifecycle, quotas, one writer at a time, host affinity in the
live scheduling cycle, the two-step delete, and the size measured instead of enforced."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.selectors import host_desired_containers
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from tests.scheduler.fleet import make_hosts
from volumes import services
from volumes.models import Volume, VolumeEvent

pytestmark = pytest.mark.django_db

LAUNCH = {"instance_type": "h100.8x", "region": "us-east-1", "image": "busybox"}


def region_id(code="us-east-1"):
    from gpucloud.catalogue.models import Region

    return Region.objects.get(code=code).pk


def create(actor, **over):
    return actor.client().post("/api/v1/volumes", {"name": "data", "region": "us-east-1", "size_gib": 100, **over},
                               format="json")


def launch(actor, name, volume=None, kind="instances", **over):
    body = {**LAUNCH, "name": name, **over}
    if volume:
        body["volumes"] = [{"volume": volume, "mount_path": "/workspace"}]
    return actor.client().post(f"/api/v1/{kind}", body, format="json")


def code(resp):
    return resp.status_code, resp.json()["error"]["code"]


def test_create_list_grow_never_shrink_and_the_quota_in_gib(alice, charlie, catalog, settings):
    settings.VOLUME_QUOTA_GIB = {"default": 300}
    r = create(alice)
    assert r.status_code == 201, r.content
    v = r.json()
    assert (v["name"], v["size_gib"], v["region"], v["state"], v["host"]) == ("data", 100, "us-east-1",
                                                                           "available", None)
    assert [x["id"] for x in alice.client().get("/api/v1/volumes").json()["results"]] == [v["id"]]
    assert charlie.client().get("/api/v1/volumes").json()["results"] == []
    assert code(create(alice)) == (409, "volume_name_taken")
    assert code(create(alice, name="other", region="mars-1")) == (400, "unknown_region")
    url = f"/api/v1/volumes/{v['id']}"
    assert alice.client().patch(url, {"size_gib": 250}, format="json").json()["size_gib"] == 250
    assert code(alice.client().patch(url, {"size_gib": 200}, format="json")) == (400, "volume_shrink")
    over = create(alice, name="more", size_gib=51)  # 250 + 51 > 300
    assert code(over) == (400, "quota_exceeded") and "size_gib" in over.json()["error"]["fields"]
    assert code(alice.client().patch(url, {"size_gib": 301}, format="json")) == (400, "quota_exceeded")
    assert create(alice, name="more", size_gib=50).status_code == 201
    assert Volume.objects.get(pk=v["id"]).size_gib == 250
    actions = list(AuditEvent.objects.filter(tenant=alice.tenant, action__startswith="volume.")
                   .order_by("created_at").values_list("action", flat=True))
    assert actions == ["volume.create", "volume.resize", "volume.create"]


def test_work_with_a_volume_goes_to_its_host_and_waits_there_with_the_reason(alice, catalog, settings):
    settings.PLAN_QUOTAS = {plan: {"max_gpus": 64, "max_instances": 32} for plan in settings.PLAN_QUOTAS}
    a, b = make_hosts(n=2, gpus=8)
    vol = create(alice).json()["id"]
    first = launch(alice, "first", vol).json()["id"]
    run_cycle(region_id=region_id())
    home = Volume.objects.get(pk=vol).host
    assert home in (a, b)  # chosen where its first user was placed
    assert alice.client().get(f"/api/v1/volumes/{vol}").json()["host"] == home.name
    assert alice.client().post(f"/api/v1/instances/{first}/stop").json()["state"] == "stopped"
    # two 8-GPU instances without volumes fill both hosts
    blockers = [launch(alice, f"big-{i}").json()["id"] for i in range(2)]
    run_cycle(region_id=region_id())
    assert Workload.objects.filter(pk__in=blockers, state=State.SCHEDULED).count() == 2
    again = launch(alice, "again", vol, instance_type="h100.2x").json()["id"]
    run_cycle(region_id=region_id())
    shown = alice.client().get(f"/api/v1/instances/{again}").json()
    assert shown["state"] == "pending"
    assert shown["reason"].startswith(f"waiting for host {home.name}, where volume data lives, "
                                      "to have 2 free H100 GPUs"), shown["reason"]
    assert shown["volumes"] == [{"volume": vol, "mount_path": "/workspace"}]
    # the blocker on the other host ends: still waiting (it may run on its volume's host only)
    on = {h: Workload.objects.filter(pk__in=blockers, allocations__active=True, allocations__host=h).distinct().get()
          for h in (a, b)}
    other = on[a if home == b else b]
    alice.client().post(f"/api/v1/instances/{other.pk}/stop")
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=again).state == State.PENDING
    alice.client().post(f"/api/v1/instances/{on[home].pk}/stop")
    run_cycle(region_id=region_id())
    placed = alice.client().get(f"/api/v1/instances/{again}").json()
    assert (placed["state"], placed["host"]) == ("scheduled", home.name)
    # the agent of that host is asked to mount it
    (desired,) = [d for d in host_desired_containers(host=home) if d.labels["gpucloud.workload"] == again]
    assert [(m.volume, m.path, m.read_only) for m in desired.mounts] == [(f"gpucloud-vol-{vol}", "/workspace",
                                                                          False)]


def test_attaching_is_refused_up_front_when_it_could_not_work(alice, charlie, catalog):
    make_hosts(n=2, gpus=8)  # two: a 2-host job could run, so the volume is what refuses it
    vol = create(alice).json()["id"]
    theirs = create(charlie).json()["id"]
    west = create(alice, name="west", region="us-west-2").json()["id"]
    before = Workload.objects.count()
    assert code(launch(alice, "x", west)) == (409, "unsatisfiable")
    assert code(launch(alice, "x", theirs)) == (400, "unknown_volume")  # another tenant's: not found
    assert code(launch(alice, "x", vol, kind="jobs", nodes=2, instance_type="h100.1x")) == (400, "validation_error")
    bad = launch(alice, "x", None, volumes=[{"volume": vol, "mount_path": "/proc/x"}])
    assert bad.status_code == 400 and "volumes" in bad.json()["error"]["fields"]
    assert Workload.objects.count() == before  # nothing created
    # one writer at a time, and no delete while attached
    w = launch(alice, "writer", vol).json()["id"]
    assert code(launch(alice, "second", vol)) == (409, "volume_attached")
    r = alice.client().delete(f"/api/v1/volumes/{vol}")
    assert code(r) == (409, "volume_attached") and "writer" in r.json()["error"]["message"]
    alice.client().post(f"/api/v1/instances/{w}/stop")  # stopping detaches
    assert alice.client().get(f"/api/v1/volumes/{vol}").json()["state"] == "available"
    assert charlie.client().delete(f"/api/v1/volumes/{vol}").status_code == 404
    assert alice.client().delete(f"/api/v1/volumes/{vol}").status_code == 204


def test_delete_is_two_steps_and_the_purge_comes_after_the_grace(alice, catalog, settings):
    settings.VOLUME_PURGE_GRACE_S = 3600
    vol = create(alice).json()["id"]
    assert alice.client().delete(f"/api/v1/volumes/{vol}").status_code == 204
    assert alice.client().get(f"/api/v1/volumes/{vol}").status_code == 404
    assert create(alice).status_code == 201  # the name is free again
    row = Volume.objects.get(pk=vol)
    assert row.deleted_at is not None and row.purged_at is None  # the data is still kept
    assert services.purge_due(now=timezone.now() + timedelta(minutes=59)) == []
    assert [v.pk for v in services.purge_due(now=timezone.now() + timedelta(minutes=61))] == [row.pk]
    assert Volume.objects.get(pk=vol).purged_at is not None
    assert AuditEvent.objects.filter(action="volume.purge", object_id=vol).count() == 1


def test_a_volume_past_its_size_gets_an_event_and_is_mounted_read_only(alice, catalog):
    (host,) = make_hosts(n=1, gpus=8)
    vol = create(alice, size_gib=1).json()["id"]
    w = launch(alice, "w", vol).json()["id"]
    run_cycle(region_id=region_id())
    name = Volume.objects.get(pk=vol).docker_name
    assert services.record_usage(host_id=host.pk, usage={name: 512 * 1024**2}) == []
    (event,) = services.record_usage(host_id=host.pk, usage={name: 2 * 1024**3})
    assert event.kind == "over_size" and "2.00 GiB used of 1 GiB" in event.message
    assert services.record_usage(host_id=host.pk, usage={name: 3 * 1024**3}) == []  # one event, not one a report
    shown = alice.client().get(f"/api/v1/volumes/{vol}").json()
    assert shown["state"] == "over_size" and shown["events"][0]["kind"] == "over_size"
    alice.client().post(f"/api/v1/instances/{w}/stop")
    again = launch(alice, "again", vol).json()["id"]
    assert Workload.objects.get(pk=again).mounts[0]["read_only"] is True
    assert VolumeEvent.objects.filter(volume_id=vol).count() == 1
