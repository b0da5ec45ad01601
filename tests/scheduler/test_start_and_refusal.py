"""Stop and start an instance; refusal up front (409 unsatisfiable) of what no host could ever run."""
from __future__ import annotations

import pytest

from agents.models import Gpu
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.lifecycle import can_transition
from scheduler.models import Allocation, Workload, WorkloadEvent
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_instances_api import launch, region_id

pytestmark = pytest.mark.django_db


def _rows():
    return Workload.objects.count(), WorkloadEvent.objects.count(), AuditEvent.objects.count()


def test_a_stopped_instance_starts_again_through_the_queue_with_the_same_configuration(alice, catalog):
    make_hosts(n=1, gpus=8)
    wid = launch(alice, instance_type="h100.4x", ports=[8888], env={"A": "1"}).json()["id"]
    run_cycle(region_id=region_id())
    assert Gpu.objects.filter(used_milli=1000).count() == 4
    # only a stopped instance starts: 409 in the error shape while it holds GPUs
    resp = alice.client().post(f"/api/v1/instances/{wid}/start")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "not_stopped", resp.json()
    assert "train-1 is scheduled" in resp.json()["error"]["message"]
    held = alice.client().get(f"/api/v1/instances/{wid}").json()
    assert held["ran_on"] is None and len(held["gpus"]) == 4
    stopped = alice.client().post(f"/api/v1/instances/{wid}/stop").json()
    assert stopped["state"] == "stopped" and stopped["gpus"] == [] and stopped["host"] is None
    # the record keeps where it ran
    assert stopped["ran_on"] == {"hosts": [held["host"]], "gpus": held["gpus"]}
    assert Gpu.objects.filter(used_milli__gt=0).count() == 0  # GPUs released

    resp = alice.client().post(f"/api/v1/instances/{wid}/start")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert body["state"] == "pending" and body["ports"] == [8888] and body["env"] == {"A": "1"}
    assert body["instance_type"] == "h100.4x" and body["started_at"] is None
    assert [e["to_state"] for e in body["events"]] == ["pending", "scheduled", "stopped", "pending"]
    assert AuditEvent.objects.filter(action="instance.start", object_id=wid).count() == 1
    run_cycle(region_id=region_id())
    again = alice.client().get(f"/api/v1/instances/{wid}").json()
    assert again["state"] == "scheduled" and len(again["gpus"]) == 4
    # terminate ends it for good: it cannot be started again
    assert alice.client().delete(f"/api/v1/instances/{wid}").status_code == 204
    assert alice.client().post(f"/api/v1/instances/{wid}/start").status_code == 404


def test_start_is_refused_for_jobs_viewers_and_other_tenants(alice, victor, charlie, catalog):
    make_hosts(n=1)
    wid = launch(alice).json()["id"]
    alice.client().post(f"/api/v1/instances/{wid}/stop")
    assert victor.client().post(f"/api/v1/instances/{wid}/start").status_code == 403
    assert charlie.client().post(f"/api/v1/instances/{wid}/start").status_code == 404
    job = launch(alice, url="/api/v1/jobs", name="j").json()["id"]
    alice.client().post(f"/api/v1/jobs/{job}/stop")
    assert alice.client().post(f"/api/v1/jobs/{job}/start").status_code == 404  # no such route for jobs
    assert Workload.objects.get(pk=wid).state == Workload.objects.get(pk=job).state == State.STOPPED


def test_lifecycle_table_has_start_and_nothing_leaves_succeeded():
    assert can_transition(State.STOPPED, State.PENDING)
    assert not can_transition(State.STOPPED, State.RUNNING)
    assert not any(can_transition(State.SUCCEEDED, s) for s in State.values)


def test_a_stopped_queued_instance_has_no_queue_position(alice, charlie, catalog):
    make_hosts(n=1, gpus=8)
    launch(charlie, instance_type="h100.8x", name="big")
    run_cycle(region_id=region_id())
    wid = launch(alice, instance_type="h100.1x").json()["id"]
    run_cycle(region_id=region_id())
    assert alice.client().get(f"/api/v1/instances/{wid}").json()["queue_position"] == 1
    stopped = alice.client().post(f"/api/v1/instances/{wid}/stop").json()
    assert stopped["state"] == "stopped" and stopped["queue_position"] is None


@pytest.mark.parametrize("url, over, words", [
    ("/api/v1/instances", {"instance_type": "a100.1x"}, "the fleet has no A100 GPUs in us-east-1"),
    ("/api/v1/instances", {"instance_type": "h100.8x"},
     "asks for 8 H100 GPUs on one host but the largest H100 host in us-east-1 has 4"),
    ("/api/v1/jobs", {"instance_type": "h100.2x", "nodes": 3},
     "asks for 3 hosts with 2 H100 GPUs each but the fleet in us-east-1 has 2"),
    ("/api/v1/instances", {"region": "us-west-2"}, "the fleet has no H100 GPUs in us-west-2"),
])
def test_a_launch_no_host_could_ever_run_is_409_unsatisfiable_and_creates_nothing(alice, catalog, url, over,
                                                                                 words):
    make_hosts(n=2, gpus=4)
    before = _rows()
    resp = launch(alice, url=url, **over)
    assert resp.status_code == 409, resp.json()
    error = resp.json()["error"]
    assert error["code"] == "unsatisfiable" and words in error["message"], error
    assert words in error["fields"]["instance_type"][0]
    assert _rows() == before


def test_work_that_could_fit_later_still_queues_with_its_reason(alice, charlie, catalog):
    hosts = make_hosts(n=1, gpus=8)
    launch(charlie, instance_type="h100.8x", name="big")
    run_cycle(region_id=region_id())
    # the only host is down: it may come back, so this is not refused either
    hosts[0].state = "down"
    hosts[0].save(update_fields=["state"])
    resp = launch(alice, instance_type="h100.8x")
    assert resp.status_code == 201 and resp.json()["state"] == "pending"


def test_start_is_refused_as_unsatisfiable_once_the_fleet_cannot_run_it(alice, catalog):
    make_hosts(n=1)
    wid = launch(alice).json()["id"]
    alice.client().post(f"/api/v1/instances/{wid}/stop")
    Allocation.objects.all().delete()
    Gpu.objects.all().delete()
    resp = alice.client().post(f"/api/v1/instances/{wid}/start")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "unsatisfiable"
    assert Workload.objects.get(pk=wid).state == State.STOPPED


def test_cost_so_far_never_goes_backwards_when_a_run_ends(alice, catalog):
    from datetime import timedelta

    from django.utils import timezone

    from scheduler.services import workload_transition

    make_hosts(n=1)
    wid = launch(alice, instance_type="h100.8x").json()["id"]
    run_cycle(region_id=region_id())
    # it was launched and placed 31 minutes ago (billing reads the transition log from creation on)
    then = timezone.now() - timedelta(minutes=31)
    Workload.objects.filter(pk=wid).update(created_at=then)
    WorkloadEvent.objects.filter(workload_id=wid).update(created_at=then)
    w = Workload.objects.get(pk=wid)
    assert workload_transition(workload=w, to=State.RUNNING, now=timezone.now() - timedelta(minutes=30))
    running = float(alice.client().get(f"/api/v1/instances/{wid}").json()["cost_so_far"])
    assert running > 0
    seen = [running]
    for state in (State.STOPPING, State.STOPPED):  # no metering ran in between
        assert workload_transition(workload=Workload.objects.get(pk=wid), to=state)
        seen.append(float(alice.client().get(f"/api/v1/instances/{wid}").json()["cost_so_far"]))
    assert seen == sorted(seen) and seen[-1] >= running, seen
