"""The live loop: a submission triggers a cycle on a real Celery worker, without waiting for beat."""
from __future__ import annotations

import time

from gpucloud.celery import app
from scheduler.choices import State
from scheduler.models import Workload
from tests.scheduler.fleet import make_hosts


def test_a_launch_is_placed_by_the_worker(worker, alice):
    from django.core.management import call_command

    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    make_hosts(n=1)
    resp = alice.client().post("/api/v1/instances", {
        "name": "nb", "instance_type": "h100.2x", "region": "us-east-1", "image": "jupyter/base-notebook",
    }, format="json")
    assert resp.status_code == 201
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = Workload.objects.get(pk=resp.json()["id"]).state
        if state != State.PENDING:
            break
        time.sleep(0.2)
    assert state == State.SCHEDULED
    assert len(alice.client().get(f"/api/v1/instances/{resp.json()['id']}").json()["gpus"]) == 2


def test_the_tick_is_in_the_beat_schedule_every_two_seconds():
    tick = app.conf.beat_schedule["scheduler-tick"]
    assert tick["task"] == "scheduler.tasks.schedule_tick_task" and tick["schedule"] == 2.0
