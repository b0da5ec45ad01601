"""Reads for workloads. Always through `tenant=`."""
from __future__ import annotations

from collections import defaultdict

from django.db.models import Prefetch, QuerySet

from gpucloud.lib.errors import NotFoundError
from gpucloud.tenancy.models import Tenant
from scheduler.choices import HOLDING
from scheduler.models import Allocation, ContainerEvent, JobArray, Workload, WorkloadEvent


def workload_list(*, tenant: Tenant, kind: str) -> QuerySet[Workload]:
    return (
        Workload.objects.for_tenant(tenant)
        .filter(kind=kind, deleted_at__isnull=True)
        .select_related("instance_type__gpu_model", "region")
        .prefetch_related(
            Prefetch("allocations", queryset=Allocation.objects.filter(active=True).select_related("host"),
                     to_attr="active_allocations"),
        )
    )


def workload_get(*, tenant: Tenant, pk) -> Workload:
    """One of `tenant`'s own workloads (instance or job, not deleted), or NotFoundError: another
    tenant's is as absent as one that never existed."""
    workload = Workload.objects.for_tenant(tenant).filter(pk=pk, deleted_at__isnull=True).first()
    if workload is None:
        raise NotFoundError("No such workload.")
    return workload


def workload_last_allocations(*, workload: Workload) -> list[Allocation]:
    """The allocations of its last run once it holds none: where it ran ("ran on"). One query.

    Released together when the run ended (one transaction), so they share `released_at`.
    Precondition: `workload` was read through a tenant-scoped selector.
    """
    rows = list(Allocation.objects.filter(workload=workload, active=False, released_at__isnull=False)
                .select_related("host").order_by("-released_at", "gpu_id"))
    return [a for a in rows if a.released_at == rows[0].released_at] if rows else []


def workload_detail_list(*, tenant: Tenant, kind: str) -> QuerySet[Workload]:
    return workload_list(tenant=tenant, kind=kind).prefetch_related(
        Prefetch("events", queryset=WorkloadEvent.objects.order_by("created_at", "id")),
        Prefetch("container_events", queryset=ContainerEvent.objects.order_by("created_at", "id")),
    )


def job_array_list(*, tenant: Tenant) -> QuerySet[JobArray]:
    return JobArray.objects.for_tenant(tenant)


def job_array_tasks(*, array: JobArray) -> list[tuple]:
    """(index, id, state, exit code) of the array's tasks not deleted, by index. One query.
    Precondition: `array` was read through `job_array_list`."""
    return list(Workload.objects.filter(array=array, deleted_at__isnull=True).order_by("array_index")
                .values_list("array_index", "pk", "state", "exit_code"))


def usage_by_scope(*, tenant: Tenant) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """GPU milli and workload counts the tenant holds, per (GPU model code, region code)."""
    gpu_milli: dict[tuple[str, str], int] = defaultdict(int)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for model, region, n, share, nodes in (
        Workload.objects.for_tenant(tenant).filter(state__in=HOLDING)
        .values_list("instance_type__gpu_model__code", "region__code", "instance_type__gpu_count",
                     "instance_type__gpu_share_milli", "nodes")
    ):
        gpu_milli[(model, region)] += n * share * nodes
        count[(model, region)] += 1
    return dict(gpu_milli), dict(count)
