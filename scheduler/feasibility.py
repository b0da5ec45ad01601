"""Could the fleet of a region ever run this? Asked before anything is created.

A launch (or a start) that no host of the region could ever hold is refused at once
with `409 unsatisfiable` and the reason (`scheduler.admission` asks `launch_unsatisfiable`:
the one admission answer), instead of a `201` and a workload that waits
forever or is rejected by the scheduler seconds later. The words are the scheduler
core's own (`scheduler.core.planner.admission.never_fits`), and so is what counts: every
host of the region in any state (a host that is down now may come back), and its GPUs
that are healthy or still booked (a broken, empty GPU takes no new work).

Work that could fit later (GPUs busy, a host cordoned) is not refused: it queues with
its reason and position.

Hook for volumes (issue 15, part 1): a volume lives on one host of one region. A volume
in another region than the launch's is unsatisfiable too; that check belongs in
`launch_unsatisfiable` beside these (give it the volume's region and host), so a launch
with such a volume is refused before anything is created.
"""
from __future__ import annotations

import functools

from django.db import connection
from django.db.models import Count, Q

from agents.models import Gpu, Host
from gpucloud.catalogue.models import InstanceType, Region

# (GPUs of one model on one host, its vCPUs, its memory MiB)
HostCap = tuple[int, int, int]


def fleet_capabilities(*, region_codes: list[str] | None = None,
                       gpu_model_ids: list[int] | None = None) -> dict[tuple[str, str], list[HostCap]]:
    """{(region code, GPU model code): [(GPUs of that model, vCPUs, memory MiB) per host]}. One query."""
    counted = Q(healthy=True) | Q(whole=True) | Q(used_milli__gt=0)
    gpus = Gpu.objects.filter(counted)
    if region_codes is not None:
        gpus = gpus.filter(host__region__code__in=region_codes)
    if gpu_model_ids is not None:
        gpus = gpus.filter(gpu_model_id__in=gpu_model_ids)
    out: dict[tuple[str, str], list[HostCap]] = {}
    for region, model, n, vcpus, mem in (
        gpus.values("host_id", "gpu_model_id")
        .annotate(n=Count("uuid"))
        .values_list("host__region__code", "gpu_model__code", "n", "host__vcpus", "host__memory_mib")
        .order_by()
    ):
        out.setdefault((region, model), []).append((n, vcpus, mem))
    return out


def region_host_counts() -> dict[str, int]:
    """{region code: hosts there, in any state}, most first: where a volume (or a launch) can live."""
    rows = Host.objects.values_list("region__code").annotate(n=Count("id")).order_by("-n", "region__code")
    return {code: n for code, n in rows}


def unsatisfiable_reason(*, instance_type: InstanceType, region: str, hosts: list[HostCap], nodes: int = 1) -> str:
    """Why no host of `hosts` (the region's, with the type's GPU model) could ever run it; "" when one could."""
    model = instance_type.gpu_model.code
    where = f" in {region}"
    if not hosts:
        return f"the fleet has no {model} GPUs{where}"
    g = instance_type.gpu_count if instance_type.gpu_share_milli >= 1000 else 1
    biggest = max(n for n, _, _ in hosts)
    if g > biggest:
        return f"asks for {g} {model} GPUs on one host but the largest {model} host{where} has {biggest}"
    big_enough = [(v, m) for n, v, m in hosts if n >= g]
    vcpus, mem = instance_type.vcpus, instance_type.memory_gib * 1024
    if not any(v >= vcpus for v, _ in big_enough):
        most = max(v for v, _ in big_enough)
        return f"asks for {vcpus} vCPUs but the largest {model} host{where} has {most}"
    if not any(v >= vcpus and m >= mem for v, m in big_enough):
        most = max(m for _, m in big_enough) // 1024
        return f"asks for {instance_type.memory_gib} GiB memory but the largest {model} host{where} has {most} GiB"
    have = sum(1 for v, m in big_enough if v >= vcpus and m >= mem)
    if nodes > have:
        return f"asks for {nodes} hosts with {g} {model} GPUs each but the fleet{where} has {have}"
    return ""


def launch_unsatisfiable(*, instance_type: InstanceType, region: Region, nodes: int = 1) -> str:
    """Why no host of `region` could ever run `nodes` nodes of `instance_type`; "" when some could.

    One query whatever the fleet size (GPUs of one model in one region, grouped by host).
    """
    return unsatisfiable_reason(instance_type=instance_type, region=region.code, nodes=nodes,
                                hosts=_region_model_hosts(region.pk, instance_type.gpu_model_id))


def _region_model_hosts(region_id: int, gpu_model_id: int) -> list[HostCap]:
    """`fleet_capabilities` of one region and one GPU model, in written SQL: this runs on every
    launch, where building the ORM's query cost more CPU than running it (docs/benchmarks.md)."""
    with connection.cursor() as cur:
        cur.execute(_region_model_hosts_sql(), [region_id, gpu_model_id])
        return [(int(n), int(v), int(m)) for n, v, m in cur.fetchall()]


@functools.cache
def _region_model_hosts_sql() -> str:
    g, h = Gpu._meta.db_table, Host._meta.db_table
    return (f'SELECT COUNT(g."uuid"), h."vcpus", h."memory_mib" FROM "{g}" g JOIN "{h}" h ON h."id" = g."host_id" '
            f'WHERE h."region_id" = %s AND g."gpu_model_id" = %s '
            f'AND (g."healthy" OR g."whole" OR g."used_milli" > 0) '  # as `fleet_capabilities` counts them
            f'GROUP BY g."host_id", h."vcpus", h."memory_mib"')

