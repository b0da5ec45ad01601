"""Tenant isolation of shared GPUs through the API and the database: two tenants'
fractional instances never share a physical GPU unless the GPU is MIG-partitioned or
its model is open to cross-tenant sharing; the guarded claim in apply refuses such a
share even when a plan asks for it."""
from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import pytest

from agents.models import Gpu
from gpucloud.catalogue.models import GpuModel
from scheduler import core, snapshot
from scheduler.apply import apply
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload
from tests.scheduler.fleet import make_hosts
from tests.scheduler.test_instances_api import launch, region_id

pytestmark = pytest.mark.django_db


def gpu_of(workload_id: str) -> str:
    return Allocation.objects.get(workload_id=workload_id, active=True).gpu_id


def test_two_tenants_launching_quarters_end_up_on_different_gpus(alice, charlie, catalog):
    make_hosts(n=1, gpus=2, model="L40S", islands=1)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    a2 = launch(alice, instance_type="l40s.quarter", name="a2").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.filter(pk__in=[a, c, a2], state=State.SCHEDULED).count() == 3
    assert gpu_of(a) == gpu_of(a2)  # one tenant's shares still pack onto one GPU
    assert gpu_of(c) != gpu_of(a)


def test_a_second_tenant_waits_while_the_only_gpu_carries_the_first_tenants_share(alice, charlie, catalog):
    make_hosts(n=1, gpus=1, model="L40S", islands=1)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    run_cycle(region_id=region_id())
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=a).state == State.SCHEDULED
    assert Workload.objects.get(pk=c).state == State.PENDING
    # charlie sees why, in words, and nothing of alice's
    reason = charlie.client().get(f"/api/v1/instances/{c}").json()["reason"]
    assert "share of a L40S GPU free" in reason and str(a) not in reason
    # once alice's share is gone, the GPU is charlie's to share
    assert alice.client().post(f"/api/v1/instances/{a}/stop").status_code == 200
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=c).state == State.SCHEDULED


def test_a_gpu_model_the_operator_opened_takes_shares_of_two_tenants_on_one_gpu(alice, charlie, catalog):
    make_hosts(n=1, gpus=1, model="L40S", islands=1)
    GpuModel.objects.filter(code="L40S").update(allow_cross_tenant_sharing=True)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.filter(pk__in=[a, c], state=State.SCHEDULED).count() == 2
    assert gpu_of(a) == gpu_of(c)


def test_a_mig_gpu_stays_closed_while_shares_are_pinned_to_the_parent_gpu(alice, charlie, catalog):
    # the parent GPU's UUID shows a container every MIG slice of it: no isolation yet
    (host,) = make_hosts(n=1, gpus=1, model="L40S", islands=1)
    Gpu.objects.filter(host=host).update(mig_enabled=True)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    run_cycle(region_id=region_id())
    assert Workload.objects.get(pk=a).state == State.SCHEDULED
    assert Workload.objects.get(pk=c).state == State.PENDING


def test_snapshot_names_the_tenant_of_each_shared_gpu(alice, charlie, catalog):
    (host,) = make_hosts(n=1, gpus=2, model="L40S", islands=1)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    run_cycle(region_id=region_id())
    views = {g.uuid: g for h in snapshot.build(region_id=region_id()).snapshot.hosts for g in h.gpus}
    assert views[gpu_of(a)].share_tenant == str(alice.tenant.pk)
    assert not views[gpu_of(a)].cross_tenant
    free = next(u for u in views if u != gpu_of(a))
    assert views[free].share_tenant is None


def _plan_share_on(gpu: str, host_id: str, request_id: str) -> core.Plan:
    return core.Plan(policy="handmade", now=0.0, decisions=(
        core.Place(request_id, (core.HostPlacement(host_id, (gpu,), 250),)),
    ))


@pytest.mark.parametrize("open_model", [False, True])
def test_the_database_refuses_a_plan_that_puts_two_tenants_on_one_gpu(alice, charlie, catalog, open_model):
    """The second line: whatever the core decided, apply's guarded claim does not add a
    share of another tenant to a GPU that is not open to sharing."""
    (host,) = make_hosts(n=1, gpus=2, model="L40S", islands=1)
    GpuModel.objects.filter(code="L40S").update(allow_cross_tenant_sharing=open_model)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    run_cycle(region_id=region_id())
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    cycle = snapshot.build(region_id=region_id())
    result = apply(plan=_plan_share_on(gpu_of(a), str(host.pk), c), cycle=cycle, now=datetime.now(UTC))
    if open_model:
        assert result.placed == 1 and gpu_of(c) == gpu_of(a)
        return
    assert result.placed == 0 and result.conflicts == 1
    assert Workload.objects.get(pk=c).state == State.PENDING
    assert Gpu.objects.get(uuid=gpu_of(a)).used_milli == 250  # nothing was added, nothing leaked
    assert not Allocation.objects.filter(workload_id=UUID(c)).exists()


def test_the_database_refuses_two_tenants_new_shares_on_one_gpu_in_one_plan(alice, charlie, catalog):
    (host,) = make_hosts(n=1, gpus=2, model="L40S", islands=1)
    a = launch(alice, instance_type="l40s.quarter", name="a").json()["id"]
    c = launch(charlie, instance_type="l40s.quarter", name="c").json()["id"]
    gpu = Gpu.objects.filter(host=host).order_by("index").first().uuid
    cycle = snapshot.build(region_id=region_id())
    plan = core.Plan(policy="handmade", now=0.0, decisions=(
        core.Place(a, (core.HostPlacement(str(host.pk), (gpu,), 250),)),
        core.Place(c, (core.HostPlacement(str(host.pk), (gpu,), 250),)),
    ))
    result = apply(plan=plan, cycle=cycle, now=datetime.now(UTC))
    assert result.placed == 0 and result.conflicts == 2
    assert Gpu.objects.get(uuid=gpu).used_milli == 0
