"""Writes for autoscaling: groups, policies, scheduled actions, member protection, and the step
policies alarms run. A change that moves a group queues its reconciliation after commit
(`reconcile_group_task`); the reconciliation itself is autoscaling/reconcile.py.
"""
from __future__ import annotations

import logging
import uuid
import zoneinfo
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from autoscaling import core
from autoscaling.choices import ActivityKind, PolicyKind, PolicyMetric
from autoscaling.models import MAX_GROUP_SIZE, Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from autoscaling.reconcile import reconcile_group
from autoscaling.tasks import reconcile_group_task
from gpucloud.lib.errors import InvalidInput, NotFoundError
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.models import Tenant
from scheduler.choices import Billing, WorkloadKind
from scheduler.services import WorkloadSpec, _resolve, workload_stop

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ groups


def _check_sizes(min_size: int, max_size: int, desired: int) -> None:
    errors: dict[str, list[str]] = {}
    if max_size > MAX_GROUP_SIZE:
        errors["max_size"] = [f"At most {MAX_GROUP_SIZE}."]
    if min_size > max_size:
        errors["min_size"] = ["Not above max_size."]
    if not min_size <= desired <= max_size:
        errors["desired"] = [f"Between min_size ({min_size}) and max_size ({max_size})."]
    if errors:
        raise InvalidInput("The sizes do not fit: min_size ≤ desired ≤ max_size.", fields=errors)


def _check_template(tenant: Tenant, *, instance_type: str, region: str, on_demand_percent: int,
                    on_demand_base: int, max_size: int) -> tuple[Any, Any]:
    """The launch template's type and region, offered as the mix will launch them."""

    spec = WorkloadSpec(kind=WorkloadKind.INSTANCE, name="template", instance_type=instance_type,
                        region=region, image="template")
    it, reg = _resolve(spec)
    if on_demand_percent < 100 and max_size > on_demand_base:
        _resolve(WorkloadSpec(kind=WorkloadKind.INSTANCE, name="template", instance_type=instance_type,
                              region=region, image="template", billing=Billing.SPOT))
    return it, reg


def _check_name(tenant: Tenant, name: str, exclude: Any = None) -> None:
    if AutoscalingGroup.objects.for_tenant(tenant).filter(name=name).exclude(pk=exclude).exists():
        raise InvalidInput(f"You already have a group named {name!r}.", code="conflict",
                           fields={"name": ["Already used."]})


@transaction.atomic
def group_create(*, tenant: Tenant, user=None, name: str, instance_type: str, region: str, image: str,
                 min_size: int = 0, max_size: int = 1, desired: int | None = None, **template: Any
                 ) -> AutoscalingGroup:
    desired = min_size if desired is None else desired
    _check_sizes(min_size, max_size, desired)
    _check_name(tenant, name)
    it, reg = _check_template(tenant, instance_type=instance_type, region=region,
                              on_demand_percent=template.get("on_demand_percent", 100),
                              on_demand_base=template.get("on_demand_base", 0), max_size=max_size)
    group = AutoscalingGroup.objects.create(
        tenant=tenant, name=name, instance_type=it, region=reg, image=image, min_size=min_size,
        max_size=max_size, desired=desired, created_by=user if user and user.is_authenticated else None,
        **template)
    Activity.objects.create(group=group, kind=ActivityKind.UPDATE, cause=f"created with desired {desired}",
                            from_desired=None, to_desired=desired)
    audit_record(tenant=tenant, action="autoscaling_group.create", obj=group, object_repr=name,
                 data={"instance_type": it.code, "region": reg.code, "min": min_size, "max": max_size})
    _reconcile_on_commit(group.pk)
    return group


@transaction.atomic
def group_update(*, group: AutoscalingGroup, **changes: Any) -> AutoscalingGroup:
    group = AutoscalingGroup.objects.select_for_update().get(pk=group.pk)
    before = group.desired
    new = {k: v for k, v in changes.items() if v is not None or k in ("job_queue",)}
    if "name" in new:
        _check_name(group.tenant, new["name"], exclude=group.pk)
    min_size = new.get("min_size", group.min_size)
    max_size = new.get("max_size", group.max_size)
    desired = new.get("desired", group.desired)
    if "desired" not in new:  # moving a bound moves desired with it
        desired = core.clamp(desired, min_size, max_size)
    _check_sizes(min_size, max_size, desired)
    if {"on_demand_percent", "on_demand_base", "max_size"} & set(new):
        _check_template(group.tenant, instance_type=group.instance_type.code, region=group.region.code,
                        on_demand_percent=new.get("on_demand_percent", group.on_demand_percent),
                        on_demand_base=new.get("on_demand_base", group.on_demand_base), max_size=max_size)
    for key, value in new.items():
        setattr(group, key, value)
    group.desired = desired
    group.save()
    if desired != before:
        Activity.objects.create(group=group, kind=ActivityKind.UPDATE, from_desired=before, to_desired=desired,
                                cause=f"desired {before} → {desired} set by hand")
    audit_record(tenant=group.tenant, action="autoscaling_group.update", obj=group, object_repr=group.name,
                 data={k: v for k, v in new.items() if k in ("min_size", "max_size", "desired")})
    _reconcile_on_commit(group.pk)
    return group


@transaction.atomic
def group_delete(*, group: AutoscalingGroup) -> None:
    """Stop every member (they stay in the instance list, stopped) and remove the group."""

    group = AutoscalingGroup.objects.select_for_update().get(pk=group.pk)
    for m in GroupMember.objects.filter(group=group, detached_at__isnull=True).select_related("workload"):
        try:
            workload_stop(workload=m.workload, reason=f"autoscaling group {group.name} deleted")
        except NotFoundError:
            pass
    audit_record(tenant=group.tenant, action="autoscaling_group.delete", obj=group, object_repr=group.name)
    # members keep their instances; the link goes with the group
    group.delete()


@transaction.atomic
def member_protect(*, group: AutoscalingGroup, instance_id: uuid.UUID, protected: bool) -> GroupMember:
    m = (GroupMember.objects.select_for_update().filter(group=group, workload_id=instance_id,
                                                         detached_at__isnull=True).first())
    if m is None:
        raise NotFoundError("No such member of this group.")
    if m.protected != protected:
        m.protected = protected
        m.save(update_fields=["protected"])
        Activity.objects.create(group=group, kind=ActivityKind.NOTE, instances=[str(instance_id)],
                                cause=f"scale-in protection {'on' if protected else 'off'} for {instance_id}")
        audit_record(tenant=group.tenant, action="autoscaling_group.protect", obj=group, object_repr=group.name,
                     data={"instance": str(instance_id), "protected": protected})
    return m


# ------------------------------------------------------------------ policies and scheduled actions


def _check_unique(model, group: AutoscalingGroup, name: str, what: str, exclude: Any = None) -> None:
    if model.objects.filter(group=group, name=name).exclude(pk=exclude).exists():
        raise InvalidInput(f"The group already has {what} named {name!r}.", code="conflict",
                           fields={"name": ["Already used."]})


def _check_policy(kind: str, fields: dict[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    if kind == PolicyKind.TARGET_TRACKING:
        if not fields.get("metric"):
            errors["metric"] = ["Target tracking needs a metric."]
        if fields.get("target") is None or fields["target"] <= 0:
            errors["target"] = ["A target above 0."]
        elif fields.get("metric") == PolicyMetric.GPU_UTIL and fields["target"] > 100:
            errors["target"] = ["A utilisation is at most 100 %."]
        if fields.get("metric") == PolicyMetric.QUEUE_BACKLOG and not fields.get("queue"):
            errors["queue"] = ["The job queue whose backlog is tracked."]
    else:
        if not fields.get("adjustment_type"):
            errors["adjustment_type"] = ["Step scaling needs an adjustment type."]
        if not fields.get("steps"):
            errors["steps"] = ["At least one step."]
    if errors:
        raise InvalidInput("The policy is incomplete.", fields=errors)


@transaction.atomic
def policy_create(*, group: AutoscalingGroup, **fields: Any) -> ScalingPolicy:
    _check_policy(fields["kind"], fields)
    _check_unique(ScalingPolicy, group, fields["name"], "a policy")
    policy = ScalingPolicy.objects.create(group=group, tenant_id=group.tenant_id, **fields)
    audit_record(tenant=group.tenant, action="scaling_policy.create", obj=policy, object_repr=policy.name)
    return policy


@transaction.atomic
def policy_update(*, policy: ScalingPolicy, **changes: Any) -> ScalingPolicy:
    for key, value in changes.items():
        setattr(policy, key, value)
    _check_policy(policy.kind, {f.name: getattr(policy, f.name) for f in ScalingPolicy._meta.fields})
    _check_unique(ScalingPolicy, policy.group, policy.name, "a policy", exclude=policy.pk)
    policy.save()
    audit_record(tenant=policy.group.tenant, action="scaling_policy.update", obj=policy, object_repr=policy.name)
    return policy


def policy_delete(*, policy: ScalingPolicy) -> None:
    audit_record(tenant=policy.group.tenant, action="scaling_policy.delete", obj=policy, object_repr=policy.name)
    policy.delete()


def _check_scheduled(fields: dict[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    if not core.cron_valid(fields.get("cron") or ""):
        errors["cron"] = ["Five cron fields: minute hour day-of-month month day-of-week, e.g. 0 9 * * 1-5."]
    if fields.get("timezone") not in zoneinfo.available_timezones():
        errors["timezone"] = ["An IANA time zone, e.g. Europe/Berlin or UTC."]
    if all(fields.get(k) is None for k in ("min_size", "max_size", "desired")):
        errors["desired"] = ["Set at least one of min_size, max_size, desired."]
    if errors:
        raise InvalidInput("The scheduled action is not valid.", fields=errors)


@transaction.atomic
def scheduled_create(*, group: AutoscalingGroup, now: datetime | None = None, **fields: Any) -> ScheduledAction:
    fields.setdefault("timezone", "UTC")
    _check_scheduled(fields)
    _check_unique(ScheduledAction, group, fields["name"], "a scheduled action")
    action = ScheduledAction.objects.create(group=group, tenant_id=group.tenant_id, created_at=now or timezone.now(),
                                            **fields)
    audit_record(tenant=group.tenant, action="scheduled_action.create", obj=action, object_repr=action.name)
    return action


@transaction.atomic
def scheduled_update(*, action: ScheduledAction, **changes: Any) -> ScheduledAction:
    for key, value in changes.items():
        setattr(action, key, value)
    _check_scheduled({f.name: getattr(action, f.name) for f in ScheduledAction._meta.fields})
    _check_unique(ScheduledAction, action.group, action.name, "a scheduled action", exclude=action.pk)
    action.save()
    audit_record(tenant=action.group.tenant, action="scheduled_action.update", obj=action, object_repr=action.name)
    return action


def scheduled_delete(*, action: ScheduledAction) -> None:
    audit_record(tenant=action.group.tenant, action="scheduled_action.delete", obj=action, object_repr=action.name)
    action.delete()


def _reconcile_on_commit(group_id: Any) -> None:
    def go() -> None:
        try:
            reconcile_group_task.delay(str(group_id))
        except Exception:  # the beat's next tick reconciles it anyway
            logger.warning("could not queue a reconcile of group %s", group_id)

    if settings.AUTOSCALING_RECONCILE_ON_CHANGE:
        transaction.on_commit(go)


# ------------------------------------------------------------------ step scaling (alarm actions)


def scaling_policy_execute(*, policy_id: Any, alarm_state: str, reason: str, metric_value: float | None = None,
                           threshold: float | None = None, tenant_id: Any = None,
                           now: datetime | None = None) -> str:
    """An alarm's action `{"type": "scaling_policy", "policy": <id>}`: apply the step policy
    for the alarm's new state. Only `ALARM` scales; `OK` and `INSUFFICIENT_DATA` change nothing.

    With `metric_value` and `threshold` the step is chosen by the breach (metric − threshold),
    else the first step applies. With `tenant_id`, a policy of another tenant is not found.
    Returns what happened, in words (for the alarm's history).
    """
    now = now or timezone.now()
    with transaction.atomic():
        qs = ScalingPolicy.objects.select_related("group").filter(pk=policy_id, kind=PolicyKind.STEP)
        if tenant_id is not None:
            qs = qs.filter(group__tenant_id=tenant_id)
        policy = qs.first()
        if policy is None:
            return "no such step scaling policy"
        if not policy.enabled:
            return f"step policy {policy.name} is disabled"
        group = AutoscalingGroup.objects.select_for_update().get(pk=policy.group_id)
        steps = tuple(core.Step(lower=s.get("lower"), upper=s.get("upper"), adjustment=int(s["adjustment"]))
                      for s in policy.steps)
        breach = metric_value - threshold if metric_value is not None and threshold is not None else None
        out = core.step_decision(
            core.StepPolicy(name=policy.name, adjustment_type=policy.adjustment_type, steps=steps,
                            cooldown_s=policy.cooldown_s, last_run_at=policy.last_run_at),
            min_size=group.min_size, max_size=group.max_size, desired=group.desired, alarm_state=alarm_state,
            reason=reason, breach=breach, now=now)
        if out is None:
            return f"step policy {policy.name}: no change ({alarm_state})"
        want, cause = out
        before = group.desired
        ScalingPolicy.objects.filter(pk=policy.pk).update(last_run_at=now)
        AutoscalingGroup.objects.filter(pk=group.pk).update(
            desired=want, **({"last_scale_out_at": now} if want > before else {"last_scale_in_at": now}))
        Activity.objects.create(group=group, kind=ActivityKind.STEP, cause=cause[:1000], from_desired=before,
                                to_desired=want, created_at=now)
    reconcile_group(group.pk, now=now)
    return cause


def next_runs(action: ScheduledAction, now: datetime | None = None) -> datetime:
    return core.cron_next_fire(action.cron, action.timezone, now or timezone.now())
