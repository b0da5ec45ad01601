"""Reconciliation of autoscaling groups: load a group as plain data, ask `autoscaling.core.decide`,
and apply the decision (launching and stopping ordinary instances through scheduler.services).

Safe with any number of workers: a group is claimed with `SELECT … FOR UPDATE SKIP LOCKED`
inside the transaction that applies its decision (another worker skips it), and the beat's run
also skips a group reconciled less than `AUTOSCALING_MIN_INTERVAL_S` ago (a guarded UPDATE of
`reconciled_at`), so two ticks that land together evaluate a group once.

Below autoscaling/services.py (the writes a tenant asks for, which queue a reconcile after they
commit) and autoscaling/tasks.py (which run it): neither is imported here.
"""
from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.models import GpuSample
from autoscaling import core
from autoscaling.choices import ActivityKind, PolicyKind, PolicyMetric
from autoscaling.models import Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from gpucloud.lib.errors import NotFoundError, ServiceError
from scheduler.choices import ACTIVE, Billing, State, WorkloadKind
from scheduler.models import Allocation, Workload
from scheduler.services import WorkloadSpec, workload_launch, workload_stop

logger = logging.getLogger(__name__)

GROUP_ENV = "GPUCLOUD_AUTOSCALING_GROUP"  # every member's env carries its group's name


# ------------------------------------------------------------------ loading a group as plain data


def gpus_per_instance(it) -> float:
    return it.gpu_count * it.gpu_share_milli / 1000


def members_gpu_util(*, members: list[GroupMember], warmup_s: int, window_s: int, now: datetime) -> float | None:
    """The members' average GPU utilisation (%) over the window: each running member's GPU
    samples averaged (`core.window_mean`: only a member whose data covers the whole window after
    its warm-up counts), then the members averaged. None: no member has such data."""

    start = now - timedelta(seconds=window_s)
    running = {m.workload.pk: m.workload.started_at for m in members
               if m.workload.state == State.RUNNING and m.workload.started_at is not None}
    if not running:
        return None
    gpus: dict[str, Any] = dict(Allocation.objects.filter(workload_id__in=list(running), active=True)
                                .values_list("gpu_id", "workload_id"))
    if not gpus:
        return None
    per_member: dict[Any, list[tuple[datetime, float]]] = defaultdict(list)
    for gpu, t, util in (GpuSample.objects.filter(gpu_id__in=list(gpus), time__gt=start, time__lte=now,
                                                  gpu_util__isnull=False)
                         .values_list("gpu_id", "time", "gpu_util")):
        per_member[gpus[gpu]].append((t, util))
    # Samples come once per heartbeat: two missed beats at either end still cover the window.
    slack_s = 3 * settings.AGENT_HEARTBEAT_INTERVAL_S
    return core.members_mean([core.window_mean(per_member.get(wid, []), running_since=started,
                                               warmup_s=warmup_s, window_s=window_s, now=now, slack_s=slack_s)
                              for wid, started in running.items()])


def _queued_jobs(tenant_id: Any, queue: str) -> int:
    return Workload.objects.filter(tenant_id=tenant_id, kind=WorkloadKind.JOB, queue=queue, state=State.PENDING,
                                   deleted_at__isnull=True).count()


def pool_demand_gpus(tenant_id: Any, queue: str) -> float:
    """GPUs of the queue's jobs that wait or run (Azure Batch's $PendingTasks: active + running)."""
    total = 0.0
    for n, share, nodes in (Workload.objects.filter(tenant_id=tenant_id, kind=WorkloadKind.JOB, queue=queue,
                                                    state__in=ACTIVE, deleted_at__isnull=True)
                            .values_list("instance_type__gpu_count", "instance_type__gpu_share_milli", "nodes")):
        total += n * share / 1000 * nodes
    return total


def group_view(group: AutoscalingGroup, now: datetime) -> tuple[core.Group, list[GroupMember]]:
    members = list(GroupMember.objects.filter(group=group, detached_at__isnull=True).select_related("workload"))
    alive = [m for m in members if m.workload.state in core.ALIVE]
    policies = []
    for p in ScalingPolicy.objects.filter(group=group, kind=PolicyKind.TARGET_TRACKING, enabled=True):
        value: float | None
        if p.metric == PolicyMetric.GPU_UTIL:
            value = members_gpu_util(members=alive, warmup_s=group.warmup_s, window_s=p.window_s, now=now)
        else:
            value = _queued_jobs(group.tenant_id, p.queue) / max(len(alive), 1)
        policies.append(core.TargetPolicy(
            id=str(p.pk), name=p.name, metric=p.metric, target=float(p.target or 0), value=value,
            window_s=p.window_s, scale_out_cooldown_s=p.scale_out_cooldown_s,
            scale_in_cooldown_s=p.scale_in_cooldown_s, max_step=p.max_step, disable_scale_in=p.disable_scale_in))
    scheduled = [core.ScheduledAction(id=str(s.pk), name=s.name, cron=s.cron, timezone=s.timezone,
                                      after=s.last_run_at or s.created_at, min_size=s.min_size,
                                      max_size=s.max_size, desired=s.desired)
                 for s in ScheduledAction.objects.filter(group=group)]
    pool = None
    if group.job_queue:
        pool = core.Pool(queue=group.job_queue, demand_gpus=pool_demand_gpus(group.tenant_id, group.job_queue),
                         gpus_per_instance=gpus_per_instance(group.instance_type))
    view = core.Group(
        min_size=group.min_size, max_size=group.max_size, desired=group.desired,
        on_demand_base=group.on_demand_base, on_demand_percent=group.on_demand_percent,
        cooldown_s=group.cooldown_s, warmup_s=group.warmup_s, last_scale_out_at=group.last_scale_out_at,
        last_scale_in_at=group.last_scale_in_at,
        members=tuple(core.Member(id=str(m.workload_id), state=m.workload.state, billing=m.billing,
                                  protected=m.protected, launched_at=m.launched_at, reason=m.workload.reason,
                                  running_since=m.workload.started_at)
                      for m in members),
        policies=tuple(policies), scheduled=tuple(scheduled), pool=pool)
    return view, members


# ------------------------------------------------------------------ applying a decision


def _launch_member(group: AutoscalingGroup, billing: str, now: datetime) -> Workload:

    spec = WorkloadSpec(
        kind=WorkloadKind.INSTANCE, name=f"{group.name}-{uuid.uuid4().hex[:6]}",
        instance_type=group.instance_type.code, region=group.region.code, image=group.image,
        command=list(group.command), env={**group.env, GROUP_ENV: group.name}, ports=list(group.ports),
        ssh_keys=list(group.ssh_keys), billing=billing)
    workload = workload_launch(tenant=group.tenant, spec=spec, user=group.created_by)
    GroupMember.objects.create(group=group, workload=workload, billing=billing, launched_at=now)
    return workload


def _activity(group: AutoscalingGroup, kind: str, cause: str, now: datetime, *, from_desired: int | None = None,
              to_desired: int | None = None, instances: list[str] | None = None) -> Activity:
    return Activity(group=group, kind=kind, cause=cause[:1000], from_desired=from_desired,
                    to_desired=to_desired, instances=instances or [], created_at=now)


def apply_decision(group: AutoscalingGroup, d: core.Decision, members: list[GroupMember],
                   now: datetime) -> list[Activity]:
    """Write what `decide` decided. Call inside the transaction holding the group's row lock."""

    acts = [_activity(group, a.kind, a.cause, now, from_desired=a.from_desired, to_desired=a.to_desired)
            for a in d.activities]
    by_id = {str(m.workload_id): m for m in members}
    for mid, why in d.detach:
        GroupMember.objects.filter(pk=by_id[mid].pk).update(detached_at=now, detach_reason=why[:500])
    if d.fired:
        ScheduledAction.objects.filter(pk__in=d.fired).update(last_run_at=now)
    stopped = []
    for mid, why in d.terminate:
        m = by_id[mid]
        GroupMember.objects.filter(pk=m.pk).update(detached_at=now, detach_reason=why[:500])
        try:
            workload_stop(workload=m.workload, reason=f"autoscaling group {group.name}: {why}")
        except NotFoundError:
            pass
        stopped.append(mid)
    if stopped:
        acts.append(_activity(group, ActivityKind.TERMINATE, f"stopped {len(stopped)} member"
                              f"{'s' if len(stopped) != 1 else ''}: scale-in to desired {d.desired}", now,
                              instances=stopped))
    launched: list[str] = []
    billings: list[str] = []
    for billing in d.launch:
        try:
            with transaction.atomic():
                w = _launch_member(group, billing, now)
        except ServiceError as e:
            last = Activity.objects.filter(group=group).order_by("-created_at", "-id").first()
            cause = f"could not launch a member: {e.message}"
            if last is None or last.cause != cause or now - last.created_at > timedelta(minutes=10):
                acts.append(_activity(group, ActivityKind.LAUNCH_FAILED, cause, now))
            break
        launched.append(str(w.pk))
        billings.append(billing)
    if launched:
        mix = ", ".join(f"{billings.count(b)} {b.replace('_', '-')}" for b in (Billing.ON_DEMAND, Billing.SPOT)
                        if billings.count(b))
        acts.append(_activity(group, ActivityKind.LAUNCH, f"launched {len(launched)} member"
                              f"{'s' if len(launched) != 1 else ''} ({mix}) to reach desired {d.desired}", now,
                              instances=launched))
    AutoscalingGroup.objects.filter(pk=group.pk).update(
        min_size=d.min_size, max_size=d.max_size, desired=d.desired, reconciled_at=now,
        last_scale_out_at=now if d.scaled_out else group.last_scale_out_at,
        last_scale_in_at=now if d.scaled_in else group.last_scale_in_at)
    Activity.objects.bulk_create(acts)
    return acts


def reconcile_group(group_id: Any, *, now: datetime | None = None, min_interval_s: float = 0) -> core.Decision | None:
    """Evaluate one group and apply the decision. None when another worker holds the group, or
    (with `min_interval_s`) when it was reconciled that recently."""
    now = now or timezone.now()
    with transaction.atomic():
        group = (AutoscalingGroup.objects.select_for_update(skip_locked=True, of=("self",))
                 .select_related("tenant", "instance_type", "region", "created_by").filter(pk=group_id).first())
        if group is None:
            return None
        if min_interval_s and group.reconciled_at and now - group.reconciled_at < timedelta(seconds=min_interval_s):
            return None
        view, members = group_view(group, now)
        decision = core.decide(view, now)
        acts = apply_decision(group, decision, members, now)
    for a in acts:
        if a.kind not in (ActivityKind.NOTE,):
            logger.info("autoscaling group=%s %s", group_id, a.cause)
    return decision


def reconcile_all(*, now: datetime | None = None, min_interval_s: float | None = None) -> int:
    """The beat task: reconcile every group; returns how many were evaluated."""
    interval = settings.AUTOSCALING_MIN_INTERVAL_S if min_interval_s is None else min_interval_s
    done = 0
    for gid in AutoscalingGroup.objects.values_list("pk", flat=True):
        try:
            if reconcile_group(gid, now=now, min_interval_s=interval) is not None:
                done += 1
        except Exception:  # one broken group must not stop the others
            logger.exception("autoscaling reconcile failed group=%s", gid)
    return done
