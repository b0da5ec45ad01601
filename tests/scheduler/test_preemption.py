from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpucloud.catalogue.models import InstanceType, Region
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from tests.scheduler.fleet import make_hosts

pytestmark = pytest.mark.django_db


def _queue(tenant, n, code, **extra):
    it = InstanceType.objects.get(code=code)
    region = Region.objects.get(code="us-east-1")
    kind = extra.pop("kind", "instance")
    return [Workload.objects.create(tenant=tenant, kind=kind, name=f"{code}-{i}",
                                    image="busybox", instance_type=it, region=region, **extra)
            for i in range(n)]


def test_critical_work_preempts_spot_after_a_notice(alice, charlie, catalog):
    make_hosts(n=1, gpus=8)
    type(charlie.tenant).objects.filter(pk=charlie.tenant.pk).update(plan="team")
    spot = _queue(charlie.tenant, 8, "h100.1x", priority="low", billing="spot", kind="job")
    region = spot[0].region_id
    run_cycle(region_id=region)
    assert Workload.objects.filter(state=State.SCHEDULED).count() == 8
    [critical] = _queue(alice.tenant, 1, "h100.1x", priority="critical")
    now = timezone.now()
    run_cycle(region_id=region, now=now)
    critical.refresh_from_db()
    assert critical.state == State.PENDING
    noticed = Workload.objects.filter(stop_by__isnull=False)
    assert noticed.count() == 1  # the cheapest set: one spot job for one GPU
    victim = noticed.get()
    assert victim.preempted_for == critical.pk
    assert victim.stop_by == now + timedelta(seconds=30)
    # the cause is data; the API's reason renders the deadline from stop_by
    assert victim.stop_cause == "preempted to make room for critical-class work"
    assert charlie.client().get(f"/api/v1/jobs/{victim.pk}").json()["reason"] == (
        f"preempted to make room for critical-class work; stopping at {victim.stop_by:%H:%M:%S} UTC")
    # the notice runs out: the victim stops PREEMPTED, goes back to the queue, critical runs
    run_cycle(region_id=region, now=now + timedelta(seconds=31))
    run_cycle(region_id=region, now=now + timedelta(seconds=32))
    critical.refresh_from_db()
    victim.refresh_from_db()
    assert critical.state == State.SCHEDULED
    assert victim.state == State.PENDING
    assert [(e.to_state, e.reason) for e in victim.events.all()][-2:] == [
        ("preempted", "preempted to make room for critical-class work"),  # no countdown once it ran out
        ("pending", "requeued after: preempted to make room for critical-class work"),
    ]


def test_static_mode_never_preempts(alice, charlie, catalog):
    from scheduler.models import RegionSchedulerSettings

    make_hosts(n=1, gpus=8)
    region = Region.objects.get(code="us-east-1")
    RegionSchedulerSettings.objects.create(region=region, policy="gpucloud", mode="static")
    type(charlie.tenant).objects.filter(pk=charlie.tenant.pk).update(plan="team")
    _queue(charlie.tenant, 8, "h100.1x", priority="low", billing="spot")
    run_cycle(region_id=region.pk)
    [critical] = _queue(alice.tenant, 1, "h100.1x", priority="critical")
    run_cycle(region_id=region.pk)
    assert not Workload.objects.filter(stop_by__isnull=False).exists()
    critical.refresh_from_db()
    assert critical.state == State.PENDING and "H100" in critical.reason


def test_region_settings_refuse_unknown_policies_and_modes(catalog):
    from django.core.exceptions import ValidationError

    from scheduler.models import RegionSchedulerSettings

    conf = RegionSchedulerSettings(region=Region.objects.get(code="us-east-1"), policy="magic", mode="turbo")
    with pytest.raises(ValidationError) as err:
        conf.full_clean()
    assert set(err.value.message_dict) == {"policy", "mode"}
    conf.policy, conf.mode = "drf", "dynamic"
    conf.full_clean()


def test_a_preemption_evicts_no_more_than_the_regions_cap(alice, charlie, catalog):
    from scheduler.models import RegionSchedulerSettings

    make_hosts(n=1, gpus=8)
    type(charlie.tenant).objects.filter(pk=charlie.tenant.pk).update(plan="team")
    [big] = _queue(charlie.tenant, 1, "h100.8x", priority="low", kind="job")
    region = big.region_id
    run_cycle(region_id=region)
    [critical] = _queue(alice.tenant, 1, "h100.1x", priority="critical")
    run_cycle(region_id=region)
    critical.refresh_from_db()
    big.refresh_from_db()
    # one GPU asked, eight would go: the default cap (1x) keeps the job running, and says so
    assert big.state == State.SCHEDULED and big.stop_by is None
    assert critical.state == State.PENDING
    assert "preempting for it would evict 8 GPUs of running work, over the cap of 1x the 1 GPU it asks for" \
        in critical.reason
    # an operator who accepts that blast radius raises the region's cap
    RegionSchedulerSettings.objects.create(region_id=region, policy="gpucloud", preempt_cap=8)
    run_cycle(region_id=region)
    big.refresh_from_db()
    assert big.stop_by is not None and big.preempted_for == critical.pk
