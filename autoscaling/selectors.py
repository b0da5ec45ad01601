"""Reads for autoscaling. Always through `tenant=`."""
from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from autoscaling.models import Activity, AutoscalingGroup, GroupMember, ScalingPolicy, ScheduledAction
from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.models import Tenant


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
