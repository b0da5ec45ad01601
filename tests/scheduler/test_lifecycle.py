from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.models import Gpu
from gpucloud.catalogue.models import InstanceType, Region
from gpucloud.lib.errors import Conflict
from scheduler.choices import HOLDING, TERMINAL, State
from scheduler.cycle import run_cycle
from scheduler.lifecycle import TRANSITIONS, can_transition
from scheduler.models import Allocation, Workload
from scheduler.reclaim import allocations_audit
from scheduler.services import workload_requeue_or_end, workload_transition
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("old,new,ok", [
    ("pending", "scheduled", True), ("scheduled", "starting", True), ("starting", "running", True),
    ("running", "succeeded", True), ("running", "preempted", True), ("preempted", "pending", True),
    ("lost", "pending", True), ("stopping", "stopped", True),
    ("pending", "running", False), ("stopped", "pending", True), ("succeeded", "running", False),
    ("running", "pending", False), ("stopped", "running", False),
])
def test_transition_table(old, new, ok):
    assert can_transition(old, new) is ok


def test_every_state_is_in_the_table_and_terminal_states_only_requeue():
    assert set(TRANSITIONS) == set(State.values)
    for state in TERMINAL:
        assert TRANSITIONS[state] <= {State.PENDING}


def _workload(tenant, code="h100.1x", kind="instance", **extra):
    return Workload.objects.create(tenant=tenant, kind=kind, name="w", image="busybox",
                                   instance_type=InstanceType.objects.get(code=code),
                                   region=Region.objects.get(code="us-east-1"), **extra)


def _place(w):
    run_cycle(region_id=w.region_id)
    w.refresh_from_db()
    assert w.state == State.SCHEDULED
    return w


def test_illegal_transition_is_refused_and_records_nothing(alice, catalog):
    w = _workload(alice.tenant)
    with pytest.raises(Conflict):
        workload_transition(workload=w, to=State.RUNNING)
    assert not w.events.exists()


def test_a_stale_transition_loses_quietly(alice, catalog):
    w = _workload(alice.tenant)
    stale = Workload.objects.get(pk=w.pk)
    assert workload_transition(workload=w, to=State.STOPPED, reason="cancelled")
    assert workload_transition(workload=stale, to=State.FAILED) is False
    w.refresh_from_db()
    assert w.state == State.STOPPED and w.events.count() == 1


@pytest.mark.parametrize("end", [State.SUCCEEDED, State.FAILED, State.PREEMPTED, State.LOST, State.STOPPING])
def test_every_way_out_frees_the_gpus(end, alice, catalog):
    make_hosts(n=1)
    w = _place(_workload(alice.tenant, "h100.4x"))
    workload_transition(workload=w, to=State.RUNNING)
    assert Gpu.objects.filter(used_milli=1000).count() == 4
    workload_transition(workload=w, to=end, reason="test")
    held = 4 if end in HOLDING else 0
    assert Gpu.objects.filter(used_milli=1000).count() == held
    assert Allocation.objects.filter(workload=w, active=True).count() == held


def test_failed_job_retries_then_fails_for_good(alice, catalog):
    make_hosts(n=1)
    w = _workload(alice.tenant, kind="job", max_retries=1)
    for expected in (State.PENDING, State.FAILED):
        _place(w)
        workload_transition(workload=w, to=State.RUNNING)
        workload_requeue_or_end(workload=w, ended=State.FAILED, reason="exit code 1")
        w.refresh_from_db()
        assert w.state == expected
    assert w.retries == 1
    assert [e.to_state for e in w.events.all()] == [
        "scheduled", "running", "failed", "pending", "scheduled", "running", "failed"]


def test_lost_job_requeues_without_spending_a_retry_but_instances_stay_lost(alice, catalog):
    make_hosts(n=1)
    job = _place(_workload(alice.tenant, kind="job"))
    inst = _place(_workload(alice.tenant))
    workload_requeue_or_end(workload=job, ended=State.LOST, reason="host down")
    workload_requeue_or_end(workload=inst, ended=State.LOST, reason="host down")
    job.refresh_from_db()
    inst.refresh_from_db()
    assert job.state == State.PENDING and job.retries == 0 and "requeued after: host down" in job.reason
    assert inst.state == State.LOST


def test_job_past_its_timeout_is_stopped(alice, catalog):
    make_hosts(n=1)
    w = _place(_workload(alice.tenant, kind="job", timeout_s=60))
    workload_transition(workload=w, to=State.RUNNING)
    run_cycle(region_id=w.region_id, now=timezone.now() + timedelta(seconds=61))
    w.refresh_from_db()
    assert w.state == State.STOPPING and w.reason == "timeout: ran longer than 60 s"
    # the agent reports the container gone: a timed-out job ends FAILED, keeping its reason
    from scheduler.services import workload_stopped

    assert workload_stopped(workload=w, reason="container gone")
    w.refresh_from_db()
    assert w.state == State.FAILED and w.reason.startswith("timeout:")


def test_audit_frees_allocations_of_ended_work_and_repairs_counters(alice, catalog):
    make_hosts(n=1)
    w = _place(_workload(alice.tenant, "h100.2x"))
    # a row left behind by a bug or a restored backup: terminal, yet still holding
    Workload.objects.filter(pk=w.pk).update(state=State.STOPPED)
    Gpu.objects.filter(used_milli=0).update(used_milli=250)  # drift on free GPUs too
    result = allocations_audit()
    assert result == {"freed_allocations": 2, "workloads": 1, "gpu_drift": 6}
    assert not Allocation.objects.filter(active=True).exists()
    assert not Gpu.objects.filter(used_milli__gt=0).exists()
    assert allocations_audit() == {"freed_allocations": 0, "workloads": 0, "gpu_drift": 0}
