"""The built-in metric sources (alarms/registry.py): one workload's GPU series and the tenant's gauges.

* `workload`: gpu_util, gpu_mem_used, gpu_temp, power, cost_rate of one instance or job, read
  by `agents.selectors.workload_series`, the very function behind GET /api/v1/metrics: an
  alarm sees what the chart shows (minute roll-ups plus the raw samples after them); and
  `container_events`, how many times in each period its container was lost or restarted
  without its agent's order (`scheduler.models.ContainerEvent`; 0 in a period without any).
* `tenant`: gauges read at each evaluation and kept on the alarm for its periods (nothing
  stores their history): `spend_rate` (the hourly price of the tenant's running work),
  `queued_gpus` (GPUs its pending work asks for), `queue_wait` (seconds its oldest pending
  workload has waited; 0 with an empty queue).
"""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.db.models import Min

from agents.selectors import SERIES_METRICS, _p95, workload_series
from alarms.registry import MetricSource, register_source
from billing.selectors import workload_costs
from gpucloud.tenancy.models import Tenant
from scheduler.choices import State
from scheduler.models import Workload
from scheduler.selectors import workload_get

WORKLOAD_METRICS = {**{m: unit for m, (_, unit) in SERIES_METRICS.items()}, "cost_rate": "currency/hour",
                    "container_events": "events"}
TENANT_METRICS = {"spend_rate": "currency/hour", "queued_gpus": "GPUs", "queue_wait": "seconds"}


def _workload_resolve(*, tenant: Tenant, target_id: str) -> str:
    uuid.UUID(target_id)  # ValueError: not an id
    return str(workload_get(tenant=tenant, pk=target_id).pk)  # NotFoundError: not the tenant's, or gone


def _workload_series(*, tenant: Tenant, target_id: str, metric: str, stat: str, start: datetime, end: datetime,
                     period: int, now: datetime) -> dict[int, float]:
    workload = workload_get(tenant=tenant, pk=target_id)
    if metric == "container_events":
        return _container_events(workload, start=start, end=end, period=period)
    points = workload_series(workload=workload, metric=metric, stat=stat, start=start, end=end, step=period,
                             now=now)["points"]
    lo, hi = start.timestamp(), end.timestamp()
    return {int(p["t"].timestamp()): p["value"] for p in points
            if p["value"] is not None and lo <= p["t"].timestamp() < hi}


def _workload_labels(*, tenant: Tenant, target_ids: list[str]) -> dict[str, str]:
    """"instance nb" for each id: alarms and their e-mails name work as its owner does, not by a UUID."""
    ids = [t for t in target_ids if _is_uuid(t)]
    return {str(pk): f"{kind} {name}" for pk, kind, name in
            Workload.objects.for_tenant(tenant).filter(pk__in=ids).values_list("pk", "kind", "name")}


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _tenant_labels(*, tenant: Tenant, target_ids: list[str]) -> dict[str, str]:
    return {t: f"tenant {tenant.name}" for t in target_ids}


def _container_events(workload: Workload, *, start: datetime, end: datetime, period: int) -> dict[int, float]:
    """Container events of `workload` per period from `start` (every period counted, 0 without any)."""
    lo, hi = epoch(start), epoch(end)
    out: dict[int, float] = {t: 0.0 for t in range(lo, hi, period)}
    for t in workload.container_events.filter(created_at__gte=start, created_at__lt=end).values_list(
            "created_at", flat=True):
        k = lo + (epoch(t) - lo) // period * period
        out[k] = out.get(k, 0.0) + 1
    return out


def _tenant_resolve(*, tenant: Tenant, target_id: str) -> str:
    return ""


def _tenant_sample(*, tenant: Tenant, target_id: str, metric: str, now: datetime) -> float | None:
    mine = Workload.objects.for_tenant(tenant).filter(deleted_at__isnull=True)
    if metric == "spend_rate":
        running = list(mine.filter(state=State.RUNNING))
        return float(sum(c.hourly for c in workload_costs(workloads=running, now=now).values() if c.hourly))
    pending = mine.filter(state=State.PENDING)
    if metric == "queued_gpus":
        return float(sum(
            (count if share >= 1000 else share / 1000) * nodes
            for count, share, nodes in pending.values_list("instance_type__gpu_count",
                                                           "instance_type__gpu_share_milli", "nodes")
        ))
    oldest = pending.aggregate(first=Min("queued_at"))["first"]
    return max(0.0, (now - oldest).total_seconds()) if oldest else 0.0


def aggregate(values: list[float], stat: str) -> float | None:
    """One period's datapoint from a sampled gauge's values in it."""
    if not values:
        return None
    return {"avg": lambda v: sum(v) / len(v), "max": max, "min": min, "sum": sum, "p95": _p95}[stat](values)


def epoch(t: datetime) -> int:
    return int(t.timestamp())


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def register_builtin() -> None:
    register_source(MetricSource("workload", WORKLOAD_METRICS, resolve=_workload_resolve, series=_workload_series,
                                 labels=_workload_labels))
    register_source(MetricSource("tenant", TENANT_METRICS, resolve=_tenant_resolve, sample=_tenant_sample,
                                 labels=_tenant_labels))
