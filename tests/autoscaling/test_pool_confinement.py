"""Batch pools are pools (issue 28): a pool's queue jobs run only on the hosts of the pool's
running members (Azure Batch's semantics), and wait for a member with that reason. The core's
filter is tested as a table in tests/scheduler/core; here the snapshot feeds it from the rows."""
from __future__ import annotations

import pytest

from autoscaling import reconcile
from scheduler import snapshot
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload
from scheduler.services import WorkloadSpec, workload_launch, workload_transition
from tests.agents.test_agent_api import region, triggered  # noqa: F401 (fixtures)
from tests.autoscaling.test_groups import live, make_group, prices  # noqa: F401 (fixtures)
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


def submit(tenant, name: str, queue: str) -> Workload:
    return workload_launch(tenant=tenant, spec=WorkloadSpec(
        kind="job", name=name, instance_type="h100.1x", region="us-east-1", image="gpucloud/test:1", queue=queue))


def run(w: Workload) -> None:
    """What the member's agent reports: started, then running."""
    assert workload_transition(workload=w, to=State.STARTING)
    assert workload_transition(workload=Workload.objects.get(pk=w.pk), to=State.RUNNING)


def test_a_pools_jobs_wait_for_a_member_then_run_only_where_members_run(prices, region, alice, charlie):
    make_hosts(n=2, gpus=8)
    group = make_group(alice, name="render", min_size=0, desired=0, max_size=2, job_queue="render")
    frame = submit(alice.tenant, "frame-0", "render")
    elsewhere = submit(alice.tenant, "plain", "default")
    theirs = submit(charlie.tenant, "their-render", "render")  # another tenant's queue of the same name
    run_cycle(region_id=region.pk)
    frame.refresh_from_db()
    assert frame.state == State.PENDING
    assert frame.reason.startswith("waiting for a member of batch pool render to run")
    # the rest of the region is untouched: other queues, and other tenants' "render", run anywhere
    assert Workload.objects.get(pk=elsewhere.pk).state == State.SCHEDULED
    assert Workload.objects.get(pk=theirs.pk).state == State.SCHEDULED

    reconcile.reconcile_group(group.pk)  # 1 GPU of demand: one member
    [member] = live(group)
    run_cycle(region_id=region.pk)
    member.refresh_from_db()
    assert member.state == State.SCHEDULED  # placed, not running yet: still no member to run on
    assert Workload.objects.get(pk=frame.pk).state == State.PENDING
    run(member)
    member_host = Allocation.objects.filter(workload=member, active=True).values_list("host_id", flat=True).first()
    queue = {r.request_id: r for r in snapshot.build(region_id=region.pk).queue}
    assert queue[str(frame.pk)].pool == "render"
    assert queue[str(frame.pk)].pool_hosts == frozenset({str(member_host)})
    run_cycle(region_id=region.pk)
    frame.refresh_from_db()
    assert frame.state == State.SCHEDULED
    assert set(Allocation.objects.filter(workload=frame, active=True).values_list("host_id", flat=True)) \
        == {member_host}
