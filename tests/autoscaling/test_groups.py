# ruff: noqa: F811 - the agent API tests' fixtures are imported and then used as arguments
"""Autoscaling groups end to end: members are ordinary instances launched through the
instance service, placed by the real scheduling cycle on simulated hosts whose in-process
agents heartbeat over HTTP to a live server. GPU load comes from the members' env
(`GPUCLOUD_SIM_GPU_UTIL`) and from samples injected into the store with explicit timestamps;
every evaluation takes an explicit `now`, so cooldowns and warm-up pass without waiting.
Health replacement runs on two real agent processes, one killed with SIGKILL."""
from __future__ import annotations

import signal
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agents import fastpath
from agents.choices import HostState
from agents.models import GpuSample, Host
from agents.tasks import hosts_liveness_task
from autoscaling import reconcile, services
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
from tests.agents.test_gang import Agent as AgentProcess
from tests.agents.test_gang import wait_for

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


def inject(workloads, util: float, at, seconds: int = 180) -> None:
    """GPU samples of the members' GPUs every 10 s over the `seconds` before `at` (a policy's
    3-minute window counts only when its data covers the window)."""
    gpus = Allocation.objects.filter(workload__in=workloads, active=True).values_list("gpu_id", flat=True)
    GpuSample.objects.bulk_create([GpuSample(gpu_id=g, time=at - timedelta(seconds=s), gpu_util=util)
                                   for g in gpus for s in range(0, seconds, 10)])


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
    reconcile.reconcile_group(group.pk, now=t0)
    converge(fleet, region)
    members = live(group)
    assert [w.state for w in members] == [State.RUNNING] * 2
    assert all(w.env["GPUCLOUD_SIM_GPU_UTIL"] == "90" and w.env["GPUCLOUD_AUTOSCALING_GROUP"] == "web"
               for w in members)
    # The agents report the env's 90 %: but the members are warming up, so nothing happens yet.
    assert GpuSample.objects.filter(gpu_util__gte=85).exists()
    reconcile.reconcile_group(group.pk, now=timezone.now())
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 2
    # Past the warm-up (60 s) and a whole window (180 s) of data, at 90 % against a target of 50 %:
    # ceil(2 * 90 / 50) = 4.
    t1 = max(w.started_at for w in members) + timedelta(seconds=250)
    inject(members, 90, t1)
    reconcile.reconcile_group(group.pk, now=t1)
    group.refresh_from_db()
    assert group.desired == 4 and len(live(group)) == 4
    assert any(c.startswith("scaled 2 → 4: avg GPU util 90 % > target 50 % for 3 min") for c in causes(group))
    converge(fleet, region)
    members = live(group)
    assert all(w.state == State.RUNNING for w in members)
    # The new members still warm up, the old ones stay at 90 %: ceil(4 * 90 / 50) = 8, bounded by max 5.
    t2 = t1 + timedelta(seconds=90)
    inject(members, 90, t2)
    reconcile.reconcile_group(group.pk, now=t2)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5
    converge(fleet, region)
    t3 = max(w.started_at for w in live(group)) + timedelta(seconds=300)
    inject(live(group), 95, t3)
    reconcile.reconcile_group(group.pk, now=t3)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5 and len(live(group)) == 5  # stops at max

    # Load drops to 10 %; protect the newest member.
    protected = live(group)[-1]
    services.member_protect(group=group, instance_id=protected.pk, protected=True)
    t4 = t3 + timedelta(seconds=120)
    inject(live(group), 10, t4)
    reconcile.reconcile_group(group.pk, now=t4)  # 120 s after the last scale-out < 300 s cooldown
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 5
    t5 = t3 + timedelta(seconds=400)
    inject(live(group), 10, t5)
    reconcile.reconcile_group(group.pk, now=t5)
    group.refresh_from_db()
    assert group.desired == 1  # ceil(5 * 10 / 50) = 1 = min
    assert [w.pk for w in live(group)] == [protected.pk]  # the protected one is what stays
    assert any("scaled 5 → 1: avg GPU util 10 % < target 50 %" in c for c in causes(group))
    stopped = Workload.objects.filter(group_member__group=group).exclude(pk=protected.pk)
    assert {w.state for w in stopped} == {State.STOPPING} and all("scale-in" in w.reason for w in stopped)
    # min 1 reached: further low load removes nothing
    reconcile.reconcile_group(group.pk, now=t5 + timedelta(seconds=600))
    assert [w.pk for w in live(group)] == [protected.pk]


def test_members_in_their_warm_up_or_with_less_data_than_the_window_do_not_scale_in(fleet, region, alice):
    """Issue 28: desired 2, a 30 s warm-up, "avg GPU util < 50 % for 3 min": it scaled in after
    41 s. Now the window needs 3 minutes of data after the warm-up, and nothing shrinks before."""
    group = make_group(alice, min_size=1, desired=2, warmup_s=30)
    services.policy_create(group=group, name="util", kind="target_tracking", metric="gpu_util", target=50)
    reconcile.reconcile_group(group.pk)
    converge(fleet, region)
    members = live(group)
    assert [w.state for w in members] == [State.RUNNING] * 2
    started = max(w.started_at for w in members)
    t = started + timedelta(seconds=41)
    inject(members, 5, t, seconds=41)  # every sample there is, from the start to 41 s
    reconcile.reconcile_group(group.pk, now=t)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 2 and len(live(group)) == 2
    assert not any(c.startswith("scaled") for c in causes(group))
    # Warm-up (30 s) plus the whole window (180 s) of low load: now it scales in.
    t2 = started + timedelta(seconds=215)
    inject(members, 5, t2)
    reconcile.reconcile_group(group.pk, now=t2)
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 1
    assert any("scaled 2 → 1: avg GPU util 5 % < target 50 % for 3 min" in c for c in causes(group))


@pytest.fixture
def agent_procs(live_server, region, prices, tmp_path, settings):  # noqa: F811
    """Two real host agent processes (`python -m agents.host`, simulated runtime) heartbeating
    every second to the live server; lost-host detection is short: DOWN after 2 s of silence,
    the work LOST 1 s later (the production defaults are 30 s and 120 s)."""
    settings.AGENT_HEARTBEAT_INTERVAL_S = 1  # the live server tells the agents their interval
    settings.HOST_DOWN_AFTER_S = 2
    settings.HOST_LOST_GRACE_S = 1
    procs = [AgentProcess(name, live_server.url, new_token(region), tmp_path) for name in ("asg-a", "asg-b")]
    try:
        wait_for(lambda: Host.objects.filter(name__in=["asg-a", "asg-b"]).count() == 2, "registration", *procs)
        yield {p.name: p for p in procs}
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.stop()


def test_a_member_whose_host_agent_is_killed_is_replaced_on_the_other_host(agent_procs, region, alice):
    """SIGKILL a member's host agent: the liveness tick (the beat task, with the short timeouts
    above) marks the host DOWN and its member LOST; the group's tick replaces the member and the
    scheduler places the replacement on the surviving host. Every wait is a condition with a
    deadline; the ticks run here in a loop as the beat would run them."""
    group = make_group(alice, min_size=1, max_size=2, desired=1)
    reconcile.reconcile_group(group.pk)
    [member] = live(group)

    def member_placed() -> bool:
        run_cycle(region_id=region.pk)
        return Allocation.objects.filter(workload=member, active=True).exists()

    wait_for(member_placed, "the member placed", *agent_procs.values(), timeout=10)
    victim = Allocation.objects.get(workload=member, active=True).host
    [survivor] = [n for n in agent_procs if n != victim.name]
    wait_for(lambda: Workload.objects.get(pk=member.pk).state == State.RUNNING, "the member running",
             *agent_procs.values(), timeout=15)

    killed = agent_procs[victim.name].proc
    killed.send_signal(signal.SIGKILL)
    assert killed.wait(timeout=5) == -signal.SIGKILL
    alive = agent_procs[survivor]

    # The beat's liveness tick: DOWN after 2 s of silence, the member LOST 1 s later. Ticked only
    # until then, so a survivor slowed by a loaded machine is not judged while it matters.
    def member_lost() -> bool:
        hosts_liveness_task()
        return Workload.objects.get(pk=member.pk).state == State.LOST

    wait_for(member_lost, "the member lost with its host", alive, timeout=15)
    assert Host.objects.get(pk=victim.pk).state == HostState.DOWN
    member.refresh_from_db()
    assert member.reason.startswith(f"host {victim.name} down")

    # The group's tick replaces it.
    def replaced() -> bool:
        reconcile.reconcile_all(min_interval_s=0)
        return len(live(group)) == 1 and live(group)[0].pk != member.pk

    wait_for(replaced, "the lost member replaced", alive, timeout=10)
    assert GroupMember.objects.get(workload=member).detached_at is not None
    assert any(f"member {member.pk} is lost" in c for c in causes(group))
    [replacement] = live(group)

    # The scheduler places the replacement on the surviving host (never the DOWN one), which runs it.
    def placed() -> bool:
        run_cycle(region_id=region.pk)
        return Allocation.objects.filter(workload=replacement, active=True).exists()

    wait_for(placed, "the replacement placed", alive, timeout=10)
    assert Allocation.objects.get(workload=replacement, active=True).host.name == survivor
    wait_for(lambda: Workload.objects.get(pk=replacement.pk).state == State.RUNNING, "the replacement running",
             alive, timeout=15)


def test_a_spot_interruption_is_replaced_on_demand(fleet, region, alice):
    from scheduler.services import workload_transition

    group = make_group(alice, min_size=1, desired=1, on_demand_percent=0)
    reconcile.reconcile_group(group.pk)
    converge(fleet, region)
    [spot] = live(group)
    assert spot.billing == "spot" and spot.state == State.RUNNING
    # the scheduler ends a spot instance whose notice ran out (scheduler/cycle.py) like this
    assert workload_transition(workload=spot, to=State.PREEMPTED, reason="preempted: spot capacity reclaimed")
    reconcile.reconcile_group(group.pk)
    [replacement] = live(group)
    assert replacement.billing == "on_demand"
    assert any("spot interruption" in c for c in causes(group))
