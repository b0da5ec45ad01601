"""Job arrays through the API: `POST /api/v1/jobs` with `array`, `/api/v1/job-arrays`."""
from __future__ import annotations

import pytest

from agents.models import Gpu, Host
from agents.selectors import host_desired_containers
from billing.accounts import launch_blocks_refresh
from billing.models import Account
from gpucloud.catalogue.models import Quota
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, JobArray, Workload, WorkloadEvent
from scheduler.services import workload_transition
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db

BODY = {"name": "sweep", "instance_type": "h100.1x", "region": "us-east-1", "image": "pytorch/pytorch:2.4.0",
        "command": ["python", "sweep.py"], "env": {"LR": "0.1"}, "max_retries": 2}


@pytest.fixture
def catalog(db):
    """The slice of the catalogue these tests use: H100 types with on-demand prices in one region
    (seed_catalog's thousands of prices cost seconds per test)."""
    from decimal import Decimal

    from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region

    region = Region.objects.create(code="us-east-1", name="US East", country="US")
    model = GpuModel.objects.create(code="H100", name="H100", vendor="nvidia", memory_gib=80,
                                    bf16_tflops=Decimal("989.4"), interconnect="NVLink")
    for n in (1, 2):
        it = InstanceType.objects.create(code=f"h100.{n}x", name=f"{n}x H100", gpu_model=model, gpu_count=n,
                                         vcpus=24 * n, memory_gib=240 * n, disk_gib=100)
        Price.objects.create(instance_type=it, region=region, kind="on_demand", per_hour=Decimal("2.5") * n)


def submit(actor, count, **over):
    return actor.client().post("/api/v1/jobs", {**BODY, "array": {"count": count}, **over}, format="json")


def region_id(code="us-east-1"):
    from gpucloud.catalogue.models import Region

    return Region.objects.get(code=code).pk


def test_an_array_of_50_is_50_tasks_with_their_indices(alice, catalog):
    make_hosts(n=1)  # a host that could run a task (an array no host could ever run is refused)
    resp = submit(alice, 50)
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert (body["name"], body["count"], body["state"], body["counts"]) == ("sweep", 50, "pending", {"pending": 50})
    assert [t["index"] for t in body["tasks"]] == list(range(50))
    assert {t["state"] for t in body["tasks"]} == {"pending"}
    tasks = {str(w.pk): w for w in Workload.objects.filter(array_id=body["id"])}
    assert len(tasks) == 50
    for t in body["tasks"]:
        w = tasks[t["id"]]
        assert (w.kind, w.array_index, w.max_retries, w.command) == ("job", t["index"], 2, ["python", "sweep.py"])
        assert w.env == {"LR": "0.1", "GPUCLOUD_ARRAY_INDEX": str(t["index"]), "GPUCLOUD_ARRAY_ID": body["id"],
                         "GPUCLOUD_ARRAY_COUNT": "50"}
    # each task is a job with its own submitted event; the array is one audit record
    assert WorkloadEvent.objects.filter(workload__array_id=body["id"], to_state=State.PENDING).count() == 50
    assert AuditEvent.objects.filter(tenant=alice.tenant, action="job_array.launch").count() == 1
    # the API lists the tasks as jobs that name their array, and the array as one object
    job = alice.client().get(f"/api/v1/jobs/{body['tasks'][7]['id']}").json()
    assert (job["array"], job["array_index"]) == (body["id"], 7)
    listed = alice.client().get("/api/v1/jobs", {"array": body["id"], "page_size": 100}).json()
    assert listed["count"] == 50
    assert alice.client().get("/api/v1/jobs", {"in_array": "false"}).json()["count"] == 0
    arrays = alice.client().get("/api/v1/job-arrays").json()
    assert [(a["id"], a["counts"]) for a in arrays["results"]] == [(body["id"], {"pending": 50})]
    assert alice.client().get(f"/api/v1/job-arrays/{body['id']}").json()["tasks"] == body["tasks"]


def test_stopping_an_array_stops_every_task_through_the_cycle(alice, catalog):
    hosts = make_hosts(n=1)  # 8 GPUs: 8 of the 50 tasks are placed
    body = submit(alice, 50).json()
    stats = run_cycle(region_id=region_id())
    assert stats.apply.placed == 8
    placed = list(Workload.objects.filter(array_id=body["id"], state=State.SCHEDULED).order_by("array_index"))
    for w in placed[:3]:  # as the agent reports them running
        assert workload_transition(workload=w, to=State.RUNNING, reason="container running")
    arr = alice.client().get(f"/api/v1/job-arrays/{body['id']}").json()
    assert (arr["state"], arr["counts"]) == ("running", {"pending": 42, "running": 3, "scheduled": 5})

    resp = alice.client().post(f"/api/v1/job-arrays/{body['id']}/stop")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["counts"] == {"stopped": 47, "stopping": 3}
    # started tasks stop on their host: they left its desired set, and the queued ones are gone
    assert host_desired_containers(host=hosts[0]) == []
    assert not Allocation.objects.filter(active=True).exclude(workload__state=State.STOPPING).exists()
    assert run_cycle(region_id=region_id()).apply.placed == 0
    # the agents report the containers gone: the array has ended
    for w in Workload.objects.filter(array_id=body["id"], state=State.STOPPING):
        assert workload_transition(workload=w, to=State.STOPPED, reason="container stopped")
    arr = alice.client().get(f"/api/v1/job-arrays/{body['id']}").json()
    assert (arr["state"], arr["counts"]) == ("stopped", {"stopped": 50})
    assert all((g.whole, g.used_milli) == (False, 0) for g in Gpu.objects.all())
    assert Host.objects.get().used_vcpus == 0
    # stopping again changes nothing
    assert alice.client().post(f"/api/v1/job-arrays/{body['id']}/stop").json()["counts"] == {"stopped": 50}
    assert AuditEvent.objects.filter(action="job_array.stop").count() == 2


def test_another_tenants_array_is_not_there(alice, charlie, catalog):
    make_hosts(n=1)
    body = submit(alice, 3).json()
    for method, url in (("get", f"/api/v1/job-arrays/{body['id']}"), ("post", f"/api/v1/job-arrays/{body['id']}/stop")):
        resp = getattr(charlie.client(), method)(url)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert charlie.client().get("/api/v1/job-arrays").json()["count"] == 0
    assert charlie.client().get("/api/v1/jobs", {"array": body["id"]}).json()["count"] == 0
    assert Workload.objects.filter(array_id=body["id"], state=State.PENDING).count() == 3


def test_bad_arrays_are_refused_creating_nothing(alice, catalog):
    for array in ({"count": 0}, {"count": 10001}, {}, {"count": "many"}, {"count": 2, "step": 1}, 5, None):
        resp = alice.client().post("/api/v1/jobs", {**BODY, "array": array}, format="json")
        assert resp.status_code == 400, (array, resp.json())
        assert "array" in resp.json()["error"]["fields"], array
    assert not Workload.objects.exists() and not JobArray.objects.exists()


def test_array_variables_are_the_arrays_own_and_instances_have_no_arrays(alice, catalog):
    resp = submit(alice, 2, env={"GPUCLOUD_ARRAY_INDEX": "9"})
    assert resp.status_code == 400 and "env" in resp.json()["error"]["fields"]
    resp = alice.client().post("/api/v1/instances", {**BODY, "array": {"count": 2}}, format="json")
    assert resp.status_code == 400 and "array" in resp.json()["error"]["fields"]
    assert not Workload.objects.exists() and not JobArray.objects.exists()


def test_the_quota_and_the_balance_refuse_the_whole_array(alice, catalog):
    make_hosts(n=1)
    Quota.objects.create(tenant=alice.tenant, max_gpus=1)
    resp = submit(alice, 20, instance_type="h100.2x")  # no task could ever run
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "quota_exceeded"
    assert not Workload.objects.exists() and not JobArray.objects.exists()
    # tasks that fit the quota one at a time queue: they run as it allows, like any jobs
    assert submit(alice, 20).status_code == 201
    Account.objects.filter(tenant=alice.tenant).update(balance=0)
    launch_blocks_refresh(tenant_ids=[alice.tenant.pk])  # as the ledger services do after a posting
    resp = submit(alice, 20)
    assert resp.status_code == 402 and resp.json()["error"]["code"] == "insufficient_credit"
    assert JobArray.objects.count() == 1 and Workload.objects.count() == 20


def test_an_array_no_host_could_ever_run_is_refused_creating_nothing(alice, catalog):
    # no H100 host in the region at all: 409 unsatisfiable, as a single launch gets
    resp = submit(alice, 5)
    assert resp.status_code == 409, resp.json()
    err = resp.json()["error"]
    assert err["code"] == "unsatisfiable" and "no H100 GPUs in us-east-1" in err["message"]
    assert "instance_type" in err["fields"]
    # a host with one H100: a task of two GPUs on one host could never run, one of one can
    make_hosts(n=1, gpus=1)
    resp = submit(alice, 5, instance_type="h100.2x")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "unsatisfiable"
    assert "largest H100 host in us-east-1 has 1" in resp.json()["error"]["message"]
    # a multi-host task template: more nodes than the region has hosts
    resp = submit(alice, 5, nodes=2)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "unsatisfiable", resp.json()
    # the single launch's words, for the same template
    single = alice.client().post("/api/v1/jobs", {**BODY, "instance_type": "h100.2x"}, format="json").json()
    assert single["error"]["message"] == "No host in us-east-1 can ever run h100.2x: asks for 2 H100 GPUs on " \
        "one host but the largest H100 host in us-east-1 has 1."
    assert not Workload.objects.exists() and not JobArray.objects.exists() and not WorkloadEvent.objects.exists()
    assert not AuditEvent.objects.filter(action="job_array.launch").exists()
    assert submit(alice, 5).status_code == 201  # the one-GPU task can run: the array queues


def test_the_console_lists_an_array_as_one_row_and_stops_it(alice, charlie, catalog):
    from django.test import Client

    make_hosts(n=1)  # a single job no host could ever run is refused (unsatisfiable)
    body = submit(alice, 12).json()
    assert alice.client().post("/api/v1/jobs", {**BODY, "name": "single"}, format="json").status_code == 201
    console = Client()
    console.force_login(alice.user)
    page = console.get("/console/jobs/")
    assert page.status_code == 200
    assert [w.name for w, _ in page.context["rows"]] == ["single"]  # the tasks are not twelve rows
    [row] = page.context["arrays"]
    assert (row.name, row.state, row.counts) == ("sweep", "pending", [("pending", 12)])
    assert f"?array={body['id']}" in page.content.decode()
    tasks = console.get("/console/jobs/", {"array": body["id"]})
    assert [w.array_index for w, _ in tasks.context["rows"]] == list(range(12))
    assert "Stop all tasks" in tasks.content.decode()
    resp = console.post(f"/console/jobs/arrays/{body['id']}/stop")
    assert resp.status_code == 302
    assert set(Workload.objects.filter(array_id=body["id"]).values_list("state", flat=True)) == {State.STOPPED}
    # another tenant's array is not there
    other = Client()
    other.force_login(charlie.user)
    assert other.get("/console/jobs/", {"array": body["id"]}).status_code == 404
    assert other.post(f"/console/jobs/arrays/{body['id']}/stop").status_code == 404
    assert other.get("/console/jobs/", {"array": "not-a-uuid"}).status_code == 404
