"""`checkpoint` on POST /api/v1/jobs: validated, stored, shown; refused in the one error shape."""
from __future__ import annotations

import pytest

from scheduler.models import Workload
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_job_arrays import BODY, catalog  # noqa: F401 - a fixture, used by name

pytestmark = pytest.mark.django_db

CHECKPOINT = {"signal": "SIGUSR1", "grace_s": 60}


def post(actor, kind="jobs", **over):
    return actor.client().post(f"/api/v1/{kind}", {**BODY, **over}, format="json")


def test_a_job_declares_its_checkpoint_and_its_detail_shows_it(alice, catalog):  # noqa: F811
    make_hosts(n=1, gpus=8)
    resp = post(alice, checkpoint=CHECKPOINT)
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert (body["checkpoint"], body["attained_gpu_s"]) == (CHECKPOINT, 0.0)
    w = Workload.objects.get(pk=body["id"])
    assert (w.checkpoint_signal, w.checkpoint_grace_s) == ("SIGUSR1", 60)
    detail = alice.client().get(f"/api/v1/jobs/{w.pk}").json()
    assert detail["checkpoint"] == CHECKPOINT
    [listed] = alice.client().get("/api/v1/jobs").json()["results"]
    assert listed["checkpoint"] == CHECKPOINT
    # without one: null, and the job is stopped at the end of its notice like any other
    plain = post(alice).json()
    assert plain["checkpoint"] is None
    assert Workload.objects.get(pk=plain["id"]).checkpoint_grace_s is None


def test_every_task_of_an_array_carries_the_checkpoint(alice, catalog):  # noqa: F811
    make_hosts(n=1, gpus=8)
    resp = post(alice, checkpoint={"signal": "SIGTERM", "grace_s": 5}, array={"count": 3})
    assert resp.status_code == 201, resp.json()
    assert set(Workload.objects.values_list("checkpoint_signal", "checkpoint_grace_s")) == {("SIGTERM", 5)}


@pytest.mark.parametrize(("checkpoint", "field"), [
    ({"signal": "SIGKILL", "grace_s": 60}, "signal"),  # not on the allow-list: it cannot be caught
    ({"signal": "USR1", "grace_s": 60}, "signal"),
    ({"signal": "SIGUSR1", "grace_s": 0}, "grace_s"),
    ({"signal": "SIGUSR1", "grace_s": 3601}, "grace_s"),
    ({"signal": "SIGUSR1", "grace_s": "a minute"}, "grace_s"),
    ({"signal": "SIGUSR1"}, "grace_s"),
    ({"grace_s": 60}, "signal"),
    ({"signal": "SIGUSR1", "grace_s": 60, "every_s": 600}, "every_s"),
])
def test_a_bad_checkpoint_is_refused_in_the_one_error_shape_and_changes_nothing(
        alice, catalog, checkpoint, field):  # noqa: F811
    make_hosts(n=1, gpus=8)
    resp = post(alice, checkpoint=checkpoint)
    assert resp.status_code == 400, resp.json()
    error = resp.json()["error"]
    assert error["code"] == "validation_error" and error["message"]
    assert f"checkpoint.{field}" in str(error["fields"]["checkpoint"]), error["fields"]
    assert not Workload.objects.exists()


@pytest.mark.parametrize("checkpoint", ["SIGUSR1", ["SIGUSR1", 60], 60])
def test_a_checkpoint_that_is_not_an_object_is_refused(alice, catalog, checkpoint):  # noqa: F811
    make_hosts(n=1, gpus=8)
    resp = post(alice, checkpoint=checkpoint)
    assert resp.status_code == 400 and "checkpoint" in str(resp.json()["error"]["fields"])
    assert not Workload.objects.exists()


def test_instances_take_no_checkpoint(alice, catalog):  # noqa: F811
    make_hosts(n=1, gpus=8)
    body = {k: v for k, v in BODY.items() if k != "max_retries"}
    resp = alice.client().post("/api/v1/instances", {**body, "checkpoint": CHECKPOINT}, format="json")
    assert resp.status_code == 400 and "checkpoint" in resp.json()["error"]["fields"]
    assert not Workload.objects.exists()


def test_the_console_shows_a_jobs_checkpoint(alice, catalog):  # noqa: F811
    from django.test import Client

    make_hosts(n=1, gpus=8)
    job = post(alice, checkpoint=CHECKPOINT).json()
    client = Client()
    client.force_login(alice.user)
    page = client.get(f"/console/jobs/{job['id']}/")
    assert page.status_code == 200
    assert "SIGUSR1, then 60 s to save before a preemption stops it" in page.content.decode()
