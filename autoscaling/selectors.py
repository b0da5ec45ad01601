"""Reads for autoscaling. Always through `tenant=`."""
from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from autoscaling.models import Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.models import Tenant
from scheduler.choices import State
from scheduler.models import Allocation


def group_list(*, tenant: Tenant) -> QuerySet[AutoscalingGroup]:
    return (AutoscalingGroup.objects.for_tenant(tenant).select_related("instance_type", "region")
            .prefetch_related(Prefetch("members", queryset=GroupMember.objects.filter(detached_at__isnull=True)
                                       .select_related("workload"), to_attr="live_members")))


def group_get(*, tenant: Tenant, pk) -> AutoscalingGroup:
    group = group_list(tenant=tenant).filter(pk=pk).first()
    if group is None:
        raise NotFoundError("No such autoscaling group.")
    return group


def activity_list(*, group: AutoscalingGroup) -> QuerySet[Activity]:
    return Activity.objects.filter(group=group).order_by("-created_at", "-id")


def policy_list(*, tenant: Tenant) -> QuerySet[ScalingPolicy]:
    return ScalingPolicy.objects.for_tenant(tenant).select_related("group")


def scheduled_list(*, tenant: Tenant) -> QuerySet[ScheduledAction]:
    return ScheduledAction.objects.for_tenant(tenant).select_related("group")


def pool_confinement(keys: set[tuple[str, str]]) -> dict[tuple[str, str], tuple[str, frozenset[str]]]:
    """For the scheduler's snapshot (registered in `scheduler.hooks`): which of these
    (tenant id, queue) pairs are a batch pool's queue, with the pool's name and the hosts its
    running members hold GPUs on. Each pair names its tenant, so no tenant sees another's pool."""
    tenants = {t for t, _q in keys}
    queues = {q for _t, q in keys}
    pools: dict[tuple[str, str], list[AutoscalingGroup]] = {}
    for g in AutoscalingGroup.objects.filter(tenant_id__in=tenants, job_queue__in=queues).order_by("name"):
        key = (str(g.tenant_id), g.job_queue)
        if key in keys:
            pools.setdefault(key, []).append(g)
    if not pools:
        return {}
    hosts: dict[object, set[str]] = {}
    for gid, host in (Allocation.objects.filter(
            active=True, workload__state=State.RUNNING,
            workload__group_member__detached_at__isnull=True,
            workload__group_member__group__in=[g for gs in pools.values() for g in gs])
            .values_list("workload__group_member__group_id", "host_id").distinct()):
        hosts.setdefault(gid, set()).add(str(host))
    return {key: (", ".join(g.name for g in gs), frozenset().union(*(hosts.get(g.pk, set()) for g in gs)))
            for key, gs in pools.items()}
