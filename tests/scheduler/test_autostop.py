# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Idle auto-stop (scheduler/autostop.py): a real sim agent over HTTP drives GPU utilisation
through its container's GPUCLOUD_SIM_GPU_UTIL; the check runs with a controllable `now`."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from agents import fastpath
from agents.models import Gpu, Host
from gpucloud.celery import app
from scheduler.autostop import REASON_PREFIX, instances_idle_stop
from scheduler.choices import State
from scheduler.models import Workload, WorkloadEvent
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    make_sim_host,
    new_token,
    place,
    region,
    triggered,
)

pytestmark = pytest.mark.django_db(transaction=True)


def running_instance(make_sim_host, alice, util: str, minutes: int | None = 30):
    a = make_sim_host("sim-a", count=2)
    a.beat()
    w = place(Host.objects.get(), alice.tenant, env={"GPUCLOUD_SIM_GPU_UTIL": util})
    Workload.objects.filter(pk=w.pk).update(auto_stop_idle_minutes=minutes)
    a.beat(3)  # the start, then samples
    fastpath.heartbeats_flush()
    w.refresh_from_db()
    assert w.state == State.RUNNING
    return a, w


def test_an_idle_instance_stops_after_its_minutes_with_a_reason_and_a_notice(make_sim_host, alice):
    _, w = running_instance(make_sim_host, alice, "0")
    held = Gpu.objects.get(allocations__workload=w, allocations__active=True)
    assert held.idle_since is not None and held.utilisation < 0.05
    now = timezone.now()
    assert instances_idle_stop(now=now + timedelta(minutes=29)) == 0  # not yet
    assert Workload.objects.get(pk=w.pk).state == State.RUNNING
    assert instances_idle_stop(now=now + timedelta(minutes=31)) == 1
    w.refresh_from_db()
    assert w.state == State.STOPPING and w.reason.startswith(REASON_PREFIX)
    event = WorkloadEvent.objects.filter(workload=w).order_by("-created_at", "-id").first()
    assert event.to_state == State.STOPPING and "30 min" in event.reason
    [notice] = mail.outbox
    assert alice.user.email in notice.to and w.name in notice.subject and REASON_PREFIX in notice.body
    assert instances_idle_stop(now=now + timedelta(minutes=40)) == 0  # once


def test_a_busy_instance_or_one_without_the_setting_keeps_running(make_sim_host, alice):
    _, busy = running_instance(make_sim_host, alice, "80")
    assert Gpu.objects.get(allocations__workload=busy, allocations__active=True).idle_since is None
    assert instances_idle_stop(now=timezone.now() + timedelta(days=1)) == 0
    Workload.objects.filter(pk=busy.pk).update(auto_stop_idle_minutes=None)
    Gpu.objects.filter(allocations__workload=busy).update(idle_since=timezone.now() - timedelta(days=1))
    assert instances_idle_stop(now=timezone.now() + timedelta(days=1)) == 0
    assert Workload.objects.get(pk=busy.pk).state == State.RUNNING and not mail.outbox


def test_idleness_counts_from_the_start_not_from_before_it(make_sim_host, alice):
    _, w = running_instance(make_sim_host, alice, "0")
    started = Workload.objects.get(pk=w.pk).started_at
    Gpu.objects.filter(allocations__workload=w).update(idle_since=started - timedelta(hours=5))
    assert instances_idle_stop(now=started + timedelta(minutes=10)) == 0
    assert instances_idle_stop(now=started + timedelta(minutes=30)) == 1


def test_the_check_is_in_the_beat_schedule():
    entry = app.conf.beat_schedule["idle-autostop"]
    assert entry["task"] == "scheduler.tasks.idle_autostop_task" and entry["schedule"] <= 60


@pytest.mark.parametrize(("body", "status", "field"), [
    ({"auto_stop_idle_minutes": 30}, 201, None),
    ({"auto_stop_idle_minutes": 2}, 400, "auto_stop_idle_minutes"),
    ({"auto_stop_idle_minutes": "soon"}, 400, "auto_stop_idle_minutes"),
])
def test_instances_take_the_setting_on_create(alice, fleet, body, status, field):
    resp = alice.client().post("/api/v1/instances", {"name": "nb", "instance_type": "h100.1x",
                                                     "region": "us-east-1", "image": "busybox", **body},
                               format="json")
    assert resp.status_code == status, resp.content
    if field:
        assert field in resp.json()["error"]["fields"]
        assert not Workload.objects.exists()
    else:
        assert resp.json()["auto_stop_idle_minutes"] == 30
        assert Workload.objects.get().auto_stop_idle_minutes == 30


def test_jobs_do_not_take_it(alice, catalog):
    resp = alice.client().post("/api/v1/jobs", {"name": "j", "instance_type": "h100.1x", "region": "us-east-1",
                                                "image": "busybox", "auto_stop_idle_minutes": 30}, format="json")
    assert resp.status_code == 400 and "auto_stop_idle_minutes" in resp.json()["error"]["fields"]
