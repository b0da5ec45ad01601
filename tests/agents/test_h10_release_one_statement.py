"""A heartbeat's ends of work on its own host: the move, its events and the release are one
statement on PostgreSQL (`scheduler.services._moved_and_released_pg`), and still lock hosts
before GPUs.

The statement runs into a host row lock held elsewhere (tests/scheduler/test_lock_order.py):
the GPUs must still be free to lock. Then the books, as `workload_transition` one by one
leaves them.
"""
from __future__ import annotations

import pytest

from agents.models import Gpu, Host
from gpucloud.catalogue.models import InstanceType, Region
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload, WorkloadEvent
from scheduler.services import workloads_transition
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_lock_order import runs_into_the_host_lock

pytestmark = pytest.mark.django_db(transaction=True)


def _placed(tenant, n: int) -> tuple[list[Workload], list[Allocation]]:
    """n one-GPU jobs placed by a cycle on one 8-GPU host, and their allocations."""
    make_hosts(n=1, gpus=8)
    ws = [Workload.objects.create(tenant=tenant, kind="job", name=f"w{i}", image="busybox",
                                  instance_type=InstanceType.objects.get(code="h100.1x"),
                                  region=Region.objects.get(code="us-east-1")) for i in range(n)]
    run_cycle(region_id=ws[0].region_id)
    allocs = list(Allocation.objects.filter(workload__in=ws, active=True))
    assert len(allocs) == n
    return ws, allocs


def test_a_heartbeats_release_in_one_statement_waits_for_the_host_before_a_gpu(alice, catalog):
    ws, allocs = _placed(alice.tenant, 2)
    assert len(workloads_transition(ids=[w.pk for w in ws], old=State.SCHEDULED, to=State.RUNNING)) == 2
    host = Host.objects.get(pk=allocs[0].host_id)
    booked_vcpus = host.used_vcpus

    moved: list = []

    def end() -> None:
        moved.extend(workloads_transition(ids=[w.pk for w in ws], old=State.RUNNING, to=State.SUCCEEDED,
                                          reason="exited 0", facts={"exit_code": 0}, hosts=[host.pk]))

    runs_into_the_host_lock(end, host=host, gpus=[a.gpu_id for a in allocs])
    assert sorted(moved) == sorted(w.pk for w in ws)
    host.refresh_from_db()
    assert host.used_vcpus == booked_vcpus - sum(a.vcpus for a in allocs)
    assert all(g.used_milli == 0 and not g.whole for g in Gpu.objects.filter(uuid__in=[a.gpu_id for a in allocs]))
    assert not Allocation.objects.filter(workload__in=ws, active=True).exists()
    for w in Workload.objects.filter(pk__in=[w.pk for w in ws]):
        assert (w.state, w.exit_code, w.reason, w.ended_at is not None) == (State.SUCCEEDED, 0, "exited 0", True)
        assert list(WorkloadEvent.objects.filter(workload=w, to_state=State.SUCCEEDED)
                    .values_list("from_state", "reason")) == [(State.RUNNING, "exited 0")]


def test_work_no_longer_in_the_old_state_is_neither_moved_nor_released(alice, catalog):
    (w,), (alloc,) = _placed(alice.tenant, 1)
    assert workloads_transition(ids=[w.pk], old=State.RUNNING, to=State.SUCCEEDED, hosts=[alloc.host_id]) == []
    assert Allocation.objects.filter(workload=w, active=True).count() == 1
    assert Gpu.objects.get(uuid=alloc.gpu_id).used_milli == alloc.milli
    assert Workload.objects.get(pk=w.pk).state == State.SCHEDULED
