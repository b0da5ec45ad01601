"""Autoscaling without hosts: scheduled actions with a test clock, batch pools following a job
queue, step scaling called as an alarm action, the beat's guard. Members are launched through
the instance service (they wait PENDING: placing them is tests/autoscaling/test_groups.py's part)."""
from __future__ import annotations

import uuid
import zoneinfo
from datetime import timedelta

import pytest
from django.utils import timezone

from autoscaling import reconcile, services
from autoscaling.models import AutoscalingGroup
from scheduler.models import Workload
from tests.agents.test_agent_api import region, registered, triggered  # noqa: F401 (fixtures)
from tests.autoscaling.test_groups import causes, live, make_group, prices  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def a_host(prices):
    """A host the members could run on: a launch no host could ever run is refused (unsatisfiable)."""
    from tests.scheduler.fleet import make_hosts

    return make_hosts(n=1)


def test_a_scheduled_action_changes_desired_at_its_time(prices, a_host, alice):
    group = make_group(alice, min_size=0, desired=0, max_size=4)
    created = timezone.now().replace(second=0, microsecond=0)
    services.scheduled_create(group=group, name="morning", cron="0 9 * * *", timezone="Europe/Berlin",
                              desired=3, now=created)
    berlin_9 = (created + timedelta(days=1)).astimezone(zoneinfo.ZoneInfo("Europe/Berlin")) \
        .replace(hour=9, minute=0, second=0, microsecond=0)
    reconcile.reconcile_group(group.pk, now=berlin_9 - timedelta(minutes=1))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 0 and live(group) == []
    reconcile.reconcile_group(group.pk, now=berlin_9 + timedelta(seconds=20))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 3 and len(live(group)) == 3
    assert any("scheduled action morning (0 9 * * * Europe/Berlin" in c and "desired 0 → 3" in c
               for c in causes(group))
    # once per time: set it back by hand, the same 09:00 does not fire again
    services.group_update(group=group, desired=1)
    reconcile.reconcile_group(group.pk, now=berlin_9 + timedelta(minutes=30))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 1


def test_a_job_queue_grows_its_pool_and_drains_it_to_zero(prices, a_host, alice):
    from scheduler.services import WorkloadSpec, workload_launch, workload_stop

    group = make_group(alice, name="render", instance_type="h100.2x", min_size=0, desired=0, max_size=3,
                       job_queue="render", cooldown_s=300)

    def submit(n: int) -> list[Workload]:
        return [workload_launch(tenant=alice.tenant, spec=WorkloadSpec(
            kind="job", name=f"frame-{i}", instance_type="h100.1x", region="us-east-1", image="gpucloud/test:1",
            queue="render")) for i in range(n)]

    t = timezone.now()
    reconcile.reconcile_group(group.pk, now=t)
    assert live(group) == []
    jobs = submit(3)  # 3 GPUs ÷ 2 per instance → 2
    reconcile.reconcile_group(group.pk, now=t + timedelta(seconds=30))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 2 and len(live(group)) == 2
    jobs += submit(4)  # 7 GPUs → 4, bounded by max 3
    reconcile.reconcile_group(group.pk, now=t + timedelta(seconds=60))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 3
    assert any("batch pool render: 7 GPUs of pending and running jobs ÷ 2 GPUs per instance" in c
               for c in causes(group))
    for j in jobs:  # drained
        workload_stop(workload=j)
    reconcile.reconcile_group(group.pk, now=t + timedelta(seconds=90))  # within the cooldown
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 3
    reconcile.reconcile_group(group.pk, now=t + timedelta(seconds=400))
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 0 and live(group) == []


def test_step_scaling_from_an_alarm(prices, a_host, alice):
    group = make_group(alice, min_size=1, desired=1, max_size=4)
    policy = services.policy_create(group=group, name="up", kind="step", adjustment_type="change_in_capacity",
                                    steps=[{"lower": 0, "upper": 20, "adjustment": 1},
                                           {"lower": 20, "upper": None, "adjustment": 2}], cooldown_s=300)
    t = timezone.now()
    assert "no change" in services.scaling_policy_execute(policy_id=policy.pk, alarm_state="OK", reason="ok", now=t)
    out = services.scaling_policy_execute(policy_id=policy.pk, alarm_state="ALARM", now=t,
                                          reason="gpu_util 95 > 70 for 2 of 2 periods", metric_value=95,
                                          threshold=70)
    assert out.startswith("scaled 1 → 3: step policy up")
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 3 and len(live(group)) == 3
    # another tenant's policy id is not found through its tenant
    assert services.scaling_policy_execute(policy_id=policy.pk, alarm_state="ALARM", reason="r",
                                           tenant_id=uuid.uuid4()) == "no such step scaling policy"


def test_the_reconciliation_is_in_the_beat_schedule_and_skips_a_group_evaluated_just_now(prices, a_host, alice):
    from gpucloud.celery import app

    entry = app.conf.beat_schedule["autoscaling-reconcile"]
    assert entry["task"] == "autoscaling.tasks.autoscaling_reconcile_task"
    group = make_group(alice, desired=1)
    t = timezone.now()
    assert reconcile.reconcile_all(now=t) == 1
    assert reconcile.reconcile_all(now=t + timedelta(seconds=5)) == 0  # a second worker's tick
    assert reconcile.reconcile_all(now=t + timedelta(seconds=20)) == 1
    assert len(live(group)) == 1


def test_an_alarm_runs_a_step_policy_and_refuses_another_tenants(prices, alice, charlie, registered):
    """The wiring of the two apps: `scaling_policy` is an alarm action (autoscaling.alarm_actions),
    validated against the tenant's own step policies and run when the alarm goes ALARM."""
    from agents.models import GpuSample, Host
    from alarms import runner
    from alarms import services as alarms
    from alarms.models import AlarmAction
    from gpucloud.lib.errors import InvalidInput
    from tests.agents.test_agent_api import place

    group = make_group(alice, min_size=1, desired=1, max_size=4)
    policy = services.policy_create(group=group, name="up", kind="step", adjustment_type="change_in_capacity",
                                    steps=[{"lower": 0, "upper": None, "adjustment": 2}], cooldown_s=300)
    target = services.policy_create(group=group, name="util", kind="target_tracking", metric="gpu_util", target=50)
    action = {"alarm": [{"type": "scaling_policy", "policy": str(policy.pk)}]}
    rule = {"target_kind": "tenant", "metric": "queued_gpus", "threshold": 1, "comparison": "ge"}
    for tenant, policy_id in ((charlie.tenant, policy.pk), (alice.tenant, target.pk), (alice.tenant, "nope")):
        with pytest.raises(InvalidInput):
            alarms.alarm_create(tenant=tenant, name="x", **rule,
                                actions={"alarm": [{"type": "scaling_policy", "policy": str(policy_id)}]})
    w = place(Host.objects.get(), alice.tenant)
    t0 = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=2)  # the alarm is due from now on
    w.allocations.update(created_at=t0 - timedelta(hours=1))
    alarms.alarm_create(tenant=alice.tenant, name="hot", target_kind="workload", target_id=str(w.pk),
                        metric="gpu_util", threshold=80, comparison="gt", period=60, evaluation_periods=1,
                        datapoints_to_alarm=1, actions=action)
    GpuSample.objects.create(gpu_id=w.allocations.get().gpu_id, time=t0 + timedelta(seconds=10), gpu_util=97.0)
    alarms.alarms_evaluate_due(now=t0 + timedelta(seconds=80))
    [run] = AlarmAction.objects.filter(type="scaling_policy")
    assert runner.alarm_action_run(run_id=run.pk, now=t0 + timedelta(seconds=81)) == "done"
    assert AlarmAction.objects.get(pk=run.pk).outcome.startswith("scaled 1 → 3: step policy up")
    assert AutoscalingGroup.objects.get(pk=group.pk).desired == 3
