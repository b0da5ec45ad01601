"""Reads for the catalogue and quotas."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from gpucloud.catalogue import hooks
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Quota, Region
from gpucloud.tenancy.models import Tenant

# Per-TFLOPS prices are tiny ($0.0025): keep six places so types stay comparable.
_TFLOPS_PRICE_PLACES = Decimal("0.000001")


def region_list() -> QuerySet[Region]:
    return Region.objects.filter(active=True)


def gpu_model_list() -> QuerySet[GpuModel]:
    return GpuModel.objects.all()


def instance_type_list() -> QuerySet[InstanceType]:
    return InstanceType.objects.filter(active=True).select_related("gpu_model")


def price_list(*, at: datetime | None = None) -> QuerySet[Price]:
    qs = Price.objects.select_related("instance_type__gpu_model", "region")
    if at is not None:
        qs = qs.filter(effective_from__lte=at)
    return qs


@dataclass(frozen=True)
class PriceView:
    region: str
    kind: str
    currency: str
    per_hour: Decimal
    per_bf16_tflops_hour: Decimal
    effective_from: datetime


def price_per_tflops_hour(*, per_hour: Decimal, instance_type: InstanceType) -> Decimal:
    """Price of one peak-BF16-TFLOPS for an hour: how users compare price/performance."""
    return (per_hour / instance_type.bf16_tflops).quantize(_TFLOPS_PRICE_PLACES, rounding=ROUND_HALF_UP)


def prices_in_force(
    *, instance_types: list[InstanceType], at: datetime | None = None
) -> dict[int, list[PriceView]]:
    """{instance_type_id: [the price in force at `at` per (region, kind)]} in one query.

    The price in force is the row with the latest effective_from <= at; later rows
    are announced changes and earlier ones history.
    """
    at = at or timezone.now()
    by_type = {it.pk: it for it in instance_types}
    rows = (
        Price.objects.filter(instance_type_id__in=by_type, effective_from__lte=at, region__active=True)
        .select_related("region")
        .order_by("instance_type_id", "region__code", "kind", "-effective_from")
    )
    result: dict[int, list[PriceView]] = {pk: [] for pk in by_type}
    seen: set[tuple[int, int, str]] = set()
    for p in rows:
        key = (p.instance_type_id, p.region_id, p.kind)
        if key in seen:
            continue
        seen.add(key)
        it = by_type[p.instance_type_id]
        result[p.instance_type_id].append(
            PriceView(
                region=p.region.code, kind=p.kind, currency=p.currency, per_hour=p.per_hour,
                per_bf16_tflops_hour=price_per_tflops_hour(per_hour=p.per_hour, instance_type=it),
                effective_from=p.effective_from,
            )
        )
    return result


def price_at(*, instance_type: InstanceType, region: Region, kind: str, at: datetime) -> Price | None:
    """The price row in force at `at`: what billing charges for a second at that moment."""
    return (
        Price.objects.filter(instance_type=instance_type, region=region, kind=kind, effective_from__lte=at)
        .order_by("-effective_from")
        .first()
    )


# ---------------------------------------------------------------- quotas


@dataclass(frozen=True)
class QuotaView:
    gpu_model: str | None
    region: str | None
    max_gpus: int | None
    max_instances: int | None
    used_gpus: Decimal
    used_instances: int
    source: str  # "plan" for the plan default, "tenant" for an operator-set row


@dataclass(frozen=True)
class Usage:
    """What a tenant holds right now, per (gpu_model code, region code)."""

    gpu_milli: dict[tuple[str, str], int]
    instances: dict[tuple[str, str], int]


def tenant_usage(*, tenant: Tenant) -> Usage:
    """GPUs (milli) and workloads the tenant holds now, keyed by (GPU model, region)."""
    gpu_milli, instances = hooks.usage(tenant=tenant)  # counted by the scheduler (gpucloud/catalogue/hooks.py)
    return Usage(gpu_milli=gpu_milli, instances=instances)


def _sum(usage: dict[tuple[str, str], int], gpu_model: str | None, region: str | None) -> int:
    return sum(
        v for (m, r), v in usage.items()
        if (gpu_model is None or m == gpu_model) and (region is None or r == region)
    )


def quota_list(*, tenant: Tenant) -> list[QuotaView]:
    """The tenant's limits beside current use: the tenant-wide limit first, then narrower ones."""
    rows = list(
        Quota.objects.for_tenant(tenant).select_related("gpu_model", "region")
        .order_by("gpu_model__code", "region__code")
    )
    usage = tenant_usage(tenant=tenant)
    views: list[QuotaView] = []
    has_tenant_wide = any(q.gpu_model_id is None and q.region_id is None for q in rows)
    if not has_tenant_wide:
        plan = settings.PLAN_QUOTAS.get(tenant.plan, {})
        views.append(_view(None, None, plan.get("max_gpus"), plan.get("max_instances"), usage, "plan"))
    for q in rows:
        views.append(
            _view(q.gpu_model.code if q.gpu_model else None, q.region.code if q.region else None,
                  q.max_gpus, q.max_instances, usage, "tenant")
        )
    views.sort(key=lambda v: (v.gpu_model is not None, v.region is not None, v.gpu_model or "", v.region or ""))
    return views


def _view(model, region, max_gpus, max_instances, usage: Usage, source: str) -> QuotaView:
    return QuotaView(
        gpu_model=model, region=region, max_gpus=max_gpus, max_instances=max_instances,
        used_gpus=Decimal(_sum(usage.gpu_milli, model, region)) / 1000,
        used_instances=_sum(usage.instances, model, region), source=source,
    )
