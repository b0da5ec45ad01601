# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Autoscaling groups end to end: members are ordinary instances launched through the
instance service, placed by the real scheduling cycle on simulated hosts whose in-process
agents heartbeat over HTTP to a live server. GPU load comes from the members' env
(`GPUCLOUD_SIM_GPU_UTIL`) and from samples injected into the store with explicit timestamps;
every evaluation takes an explicit `now`, so cooldowns and warm-up pass without waiting."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agents import fastpath
from agents.models import GpuSample, Host
from agents.services import hosts_check_liveness
from autoscaling import services
from autoscaling.models import Activity, AutoscalingGroup, GroupMember
from gpucloud.catalogue.models import InstanceType, Price
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload
from tests.agents.test_agent_api import (  # noqa: F401 (fixtures)
    make_sim_host,
    new_token,
    region,
    triggered,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def prices(region, settings, triggered):
    """On-demand and spot prices for h100.1x, on-demand for h100.2x, in us-east-1."""
    settings.AUTOSCALING_RECONCILE_ON_CHANGE = False  # each test evaluates with its own clock
    for code, kind, price in (("h100.1x", "on_demand", "2.00"), ("h100.1x", "spot", "0.80"),
                              ("h100.2x", "on_demand", "4.00")):
        Price.objects.create(instance_type=InstanceType.objects.get(code=code), region=region, kind=kind,
                             per_hour=Decimal(price), effective_from=timezone.now() - timedelta(days=1))


@pytest.fixture
def fleet(make_sim_host, prices):
    """Two simulated 8-GPU hosts whose in-process agents heartbeat to the live server."""
    hosts = [make_sim_host("sim-a"), make_sim_host("sim-b")]
    for h in hosts:
        h.beat()
    return hosts


def converge(fleet, region) -> None:
    """The scheduler places what is pending; the agents start it and report."""
    run_cycle(region_id=region.pk)
    for h in fleet:
        h.beat(2)
    fastpath.heartbeats_flush()


def live(group) -> list[Workload]:
    return list(Workload.objects.filter(group_member__group=group, group_member__detached_at__isnull=True)
                .order_by("created_at"))


def inject(workloads, util: float, at) -> None:
    """GPU samples of the members' GPUs, at `at` and the two minutes before it."""
    gpus = Allocation.objects.filter(workload__in=workloads, active=True).values_list("gpu_id", flat=True)
    GpuSample.objects.bulk_create([GpuSample(gpu_id=g, time=at - timedelta(seconds=s), gpu_util=util)
                                   for g in gpus for s in (0, 60, 120)])


def make_group(alice, **kw):
    kw = {"name": "web", "instance_type": "h100.1x", "region": "us-east-1", "image": "gpucloud/test:1",
          "min_size": 1, "max_size": 5, "desired": 2, "warmup_s": 60, **kw}
    return services.group_create(tenant=alice.tenant, user=alice.user, **kw)


def causes(group) -> list[str]:
    return list(Activity.objects.filter(group=group).order_by("created_at", "id").values_list("cause", flat=True))


def test_target_tracking_scales_out_to_max_then_in_after_cooldown_to_min_keeping_protected(fleet, region, alice):
    group = make_group(alice, env={"GPUCLOUD_SIM_GPU_UTIL": "90"})
    services.policy_create(group=group, name="util", kind="target_tracking", metric="gpu_util", target=50)
    t0 = timezone.now()
    services.reconcile_group(group.pk, now=t0)
    converge(fleet, region)
    members = live(group)
    assert [w.state for w in members] == [State.RUNNING] * 2
    assert all(w.env["GPUCLOUD_SIM_GPU_UTIL"] == "90" and w.env["GPUCLOUD_AUTOSCALING_GROUP"] == "web"
               for w in members)
    # The agents report the env's 90 %: but the members are warming up, so nothing happens yet.
    assert GpuSample.objects.filter(gpu_util__gte=85).exists()
    services.reconcile_group(group.pk, now=timezone.now())
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 2
    # Past the warm-up, at 90 % against a target of 50 %: ceil(2 * 90 / 50) = 4.
    t1 = max(w.started_at for w in members) + timedelta(seconds=200)
    inject(members, 90, t1)
    services.reconcile_group(group.pk, now=t1)
    group.refresh_from_db()
    assert group.desired == 4 and len(live(group)) == 4
    assert any(c.startswith("scaled 2 → 4: avg GPU util 90 % > target 50 % for 3 min") for c in causes(group))
    converge(fleet, region)
    members = live(group)
    assert all(w.state == State.RUNNING for w in members)
    # The new members still warm up, the old ones stay at 90 %: ceil(4 * 90 / 50) = 8, bounded by max 5.
    t2 = t1 + timedelta(seconds=90)
    inject(members, 90, t2)
    services.reconcile_group(group.pk, now=t2)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5
    converge(fleet, region)
    t3 = max(w.started_at for w in live(group)) + timedelta(seconds=300)
    inject(live(group), 95, t3)
    services.reconcile_group(group.pk, now=t3)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5 and len(live(group)) == 5  # stops at max

    # Load drops to 10 %; protect the newest member.
    protected = live(group)[-1]
    services.member_protect(group=group, instance_id=protected.pk, protected=True)
    t4 = t3 + timedelta(seconds=120)
    inject(live(group), 10, t4)
    services.reconcile_group(group.pk, now=t4)  # 120 s after the last scale-out < 300 s cooldown
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5
    t5 = t3 + timedelta(seconds=400)
    inject(live(group), 10, t5)
    services.reconcile_group(group.pk, now=t5)
    group.refresh_from_db()
    assert group.desired == 1  # ceil(5 * 10 / 50) = 1 = min
    assert [w.pk for w in live(group)] == [protected.pk]  # the protected one is what stays
    assert any("scaled 5 → 1: avg GPU util 10 % < target 50 %" in c for c in causes(group))
    stopped = Workload.objects.filter(group_member__group=group).exclude(pk=protected.pk)
    assert {w.state for w in stopped} == {State.STOPPING} and all("scale-in" in w.reason for w in stopped)
    # min 1 reached: further low load removes nothing
    services.reconcile_group(group.pk, now=t5 + timedelta(seconds=600))
    assert [w.pk for w in live(group)] == [protected.pk]


def test_a_member_whose_host_is_lost_is_replaced(fleet, region, alice):
    group = make_group(alice, min_size=2, desired=2)
    services.reconcile_group(group.pk)
    converge(fleet, region)
    before = live(group)
    assert [w.state for w in before] == [State.RUNNING] * 2
    # A member's host dies: its agent stops heartbeating (as after a SIGKILL); 200 s later the
    # liveness check has marked it DOWN, and past the grace its work LOST.
    victim_host = Allocation.objects.filter(workload=before[0]).first().host
    now = timezone.now()
    Host.objects.filter(pk=victim_host.pk).update(last_heartbeat_at=now - timedelta(seconds=200))
    assert hosts_check_liveness(now=now).down == [str(victim_host.pk)]
    Host.objects.filter(pk=victim_host.pk).update(down_since=now - timedelta(seconds=170))
    hosts_check_liveness(now=now)
    lost = [w for w in before if Workload.objects.get(pk=w.pk).state == State.LOST]
    assert lost
    services.reconcile_group(group.pk)
    after = live(group)
    assert len(after) == 2 and not {w.pk for w in lost} & {w.pk for w in after}
    assert GroupMember.objects.get(workload=lost[0]).detached_at is not None
    assert any(f"member {lost[0].pk} is lost" in c for c in causes(group))
    # the survivor host takes the replacement
    run_cycle(region_id=region.pk)
    [alive_host] = [h for h in fleet if h.host.pk != victim_host.pk]
    alive_host.beat(2)
    assert {Workload.objects.get(pk=w.pk).state for w in after} == {State.RUNNING}


def test_a_spot_interruption_is_replaced_on_demand(fleet, region, alice):
    from scheduler.services import workload_transition

    group = make_group(alice, min_size=1, desired=1, on_demand_percent=0)
    services.reconcile_group(group.pk)
    converge(fleet, region)
    [spot] = live(group)
    assert spot.billing == "spot" and spot.state == State.RUNNING
    # the scheduler ends a spot instance whose notice ran out (scheduler/cycle.py) like this
    assert workload_transition(workload=spot, to=State.PREEMPTED, reason="preempted: spot capacity reclaimed")
    services.reconcile_group(group.pk)
    [replacement] = live(group)
    assert replacement.billing == "on_demand"
    assert any("spot interruption" in c for c in causes(group))
