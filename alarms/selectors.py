"""Reads for alarms. Always through `tenant=`."""
from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from alarms.models import Alarm, AlarmAction, AlarmHistory
from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.models import Tenant


def alarm_list(*, tenant: Tenant) -> QuerySet[Alarm]:
    return Alarm.objects.for_tenant(tenant)


def alarm_get(*, tenant: Tenant, pk) -> Alarm:
    alarm = Alarm.objects.for_tenant(tenant).filter(pk=pk).first()
    if alarm is None:
        raise NotFoundError("No such alarm.")
    return alarm


def alarm_history_list(*, alarm: Alarm) -> QuerySet[AlarmHistory]:
    """An alarm's state changes, newest first, each with the actions it set off.
    Precondition: `alarm` was read through a tenant-scoped selector."""
    return AlarmHistory.objects.filter(alarm=alarm).prefetch_related(
        Prefetch("actions", queryset=AlarmAction.objects.order_by("id")))
