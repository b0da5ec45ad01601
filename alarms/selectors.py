"""Reads for alarms. Always through `tenant=`."""
from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from alarms.models import Alarm, AlarmAction, AlarmHistory
from alarms.registry import sources
from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.models import Tenant


def alarm_list(*, tenant: Tenant) -> QuerySet[Alarm]:
    return Alarm.objects.for_tenant(tenant)


def alarm_target_labels(*, tenant: Tenant, alarms: list[Alarm]) -> dict[str, str]:
    """{alarm id: what it watches, in words} ("instance nb", "tenant Acme"): one read per kind of
    target, whatever the number of alarms. A target that cannot be named (gone) keeps its kind and id."""
    by_kind: dict[str, list[Alarm]] = {}
    for a in alarms:
        by_kind.setdefault(a.target_kind, []).append(a)
    out: dict[str, str] = {}
    for kind, these in by_kind.items():
        source = sources().get(kind)
        names = (source.labels(tenant=tenant, target_ids=[a.target_id for a in these])
                 if source is not None and source.labels is not None else {})
        for a in these:
            out[str(a.pk)] = names.get(a.target_id) or f"{kind} {a.target_id}".strip()
    return out


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
