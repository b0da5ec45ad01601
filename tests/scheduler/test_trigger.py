"""No cycle trigger is lost: a submission that commits while a cycle runs gets a cycle of its own.

The beat tick and a submission share the trigger's debounce key. A submission that commits just
after the tick's cycle has read the queue must not wait for the next tick: the cycle sees the
trigger generation move and queues one more cycle when it ends. Ordered by the cycle's own
`cycle_loaded` signal (the submission commits inside it), on the real broker, without a worker:
the test takes the queued task messages from Redis and runs them itself.
"""
from __future__ import annotations

import pytest
from django.core.management import call_command

from gpucloud.catalogue.models import Region
from gpucloud.celery import app
from scheduler.choices import State
from scheduler.cycle import cycle_loaded
from scheduler.models import Workload
from scheduler.tasks import schedule_cycle_task, schedule_tick_task
from tests.scheduler.fleet import make_hosts


def _queued_cycles(conn) -> list[int]:
    """Take every message off the default queue; the regions of the cycle tasks among them."""
    queue = conn.SimpleQueue(app.conf.task_default_queue, no_ack=True)
    regions = []
    try:
        while True:
            try:
                msg = queue.get(timeout=0.2)
            except queue.Empty:
                return regions
            if msg.headers.get("task") == schedule_cycle_task.name:
                args, _kwargs, _embed = msg.decode()
                regions.append(args[0])
    finally:
        queue.close()


@pytest.mark.django_db(transaction=True)
def test_a_submission_right_after_the_ticks_cycle_read_the_queue_is_placed_by_its_own_trigger(alice):
    from django.core.cache import cache

    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    make_hosts(n=1)
    region = Region.objects.get(code="us-east-1").pk
    cache.clear()
    app.control.purge()
    submitted: list[str] = []
    pending_when_read: list[int] = []

    def submit_after_the_read(sender, region_id, **kwargs):
        if submitted:
            return
        pending_when_read.append(Workload.objects.filter(state=State.PENDING).count())
        resp = alice.client().post("/api/v1/jobs", {
            "name": "late", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
            "command": ["true"],
        }, format="json")
        assert resp.status_code == 201, resp.content
        submitted.append(resp.json()["id"])

    with app.connection_for_write() as conn:
        first = alice.client().post("/api/v1/jobs", {
            "name": "first", "instance_type": "h100.1x", "region": "us-east-1", "image": "busybox",
        }, format="json")
        assert first.status_code == 201
        schedule_tick_task()  # the beat tick: a cycle for the region with work
        assert region in _queued_cycles(conn)
        cycle_loaded.connect(submit_after_the_read)
        try:
            schedule_cycle_task(region)  # the tick's cycle; the submission commits inside it
        finally:
            cycle_loaded.disconnect(submit_after_the_read)
        job = Workload.objects.get(pk=submitted[0])
        assert pending_when_read == [1] and job.state == State.PENDING  # the tick's cycle missed it
        assert Workload.objects.get(pk=first.json()["id"]).state == State.SCHEDULED
        queued = _queued_cycles(conn)
        assert queued == [region]  # its own trigger, not a later tick
        schedule_cycle_task(region)
        job.refresh_from_db()
        assert job.state == State.SCHEDULED
        assert _queued_cycles(conn) == []  # nothing new since: no cycle after that one


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_triggers_queues_one_cycle():
    from django.core.cache import cache

    from scheduler.tasks import trigger_cycle

    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    region = Region.objects.get(code="us-east-1").pk
    cache.clear()
    app.control.purge()
    with app.connection_for_write() as conn:
        for _ in range(20):
            trigger_cycle(region)
        assert _queued_cycles(conn) == [region]


@pytest.mark.django_db(transaction=True)
def test_the_tick_runs_cycles_only_where_there_is_work(alice):
    from django.core.cache import cache

    call_command("seed_catalog", stdout=open("/dev/null", "w"))
    east, west = (Region.objects.get(code=c).pk for c in ("us-east-1", "us-west-2"))
    from tests.scheduler.fleet import make_hosts

    make_hosts(n=1, region="us-west-2")  # a job no host could ever run is refused (unsatisfiable)
    cache.clear()
    app.control.purge()
    with app.connection_for_write() as conn:
        schedule_tick_task()
        assert _queued_cycles(conn) == []  # an idle platform: no cycles at all
        resp = alice.client().post("/api/v1/jobs", {
            "name": "w", "instance_type": "h100.1x", "region": "us-west-2", "image": "busybox",
        }, format="json")
        assert resp.status_code == 201
        assert _queued_cycles(conn) == [west]  # the submission's own trigger
        cache.clear()  # the trigger's debounce
        schedule_tick_task()
        assert _queued_cycles(conn) == [west]  # queued work: its region ticks, no other
        assert east not in _queued_cycles(conn)
