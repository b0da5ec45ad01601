"""Catalogue API (public reads) and the tenant's quotas."""
from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response

from gpucloud.api.filters import UtcIsoDateTimeFilter
from gpucloud.api.views import ApiView, PublicReadViewSet, TenantMixin
from gpucloud.catalogue import hooks, selectors
from gpucloud.catalogue.api import serializers as s
from gpucloud.catalogue.choices import PriceKind, Vendor
from gpucloud.catalogue.models import GpuModel, InstanceType, Price, Region
from gpucloud.tenancy import permissions as perms


class RegionViewSet(PublicReadViewSet):
    serializer_class = s.RegionSerializer

    def get_queryset(self):
        return selectors.region_list()


class GpuModelFilter(django_filters.FilterSet):
    vendor = django_filters.ChoiceFilter(choices=Vendor.choices)

    class Meta:
        model = GpuModel
        fields = ["vendor"]


class GpuModelViewSet(PublicReadViewSet):
    serializer_class = s.GpuModelSerializer
    filterset_class = GpuModelFilter
    ordering_fields = ["code", "bf16_tflops", "memory_gib"]

    def get_queryset(self):
        return selectors.gpu_model_list()


class InstanceTypeFilter(django_filters.FilterSet):
    gpu_model = django_filters.ModelChoiceFilter(
        field_name="gpu_model", to_field_name="code", queryset=GpuModel.objects.all()
    )
    vendor = django_filters.ChoiceFilter(field_name="gpu_model__vendor", choices=Vendor.choices)
    region = django_filters.ModelChoiceFilter(
        field_name="prices__region", to_field_name="code", queryset=Region.objects.filter(active=True),
        distinct=True, label="Only types with a price in this region",
    )
    min_gpus = django_filters.NumberFilter(field_name="gpu_count", lookup_expr="gte", min_value=1, max_value=64)
    fractional = django_filters.BooleanFilter(method="filter_fractional")
    runnable = django_filters.BooleanFilter(
        method="filter_runnable",
        label="true: only types some host of this fleet could run, and only those regions of them "
              "(hides availability never)")

    class Meta:
        model = InstanceType
        fields = ["gpu_model", "vendor", "region", "min_gpus", "fractional", "runnable"]

    def filter_fractional(self, queryset, name, value):
        return queryset.filter(gpu_share_milli__lt=1000) if value else queryset.filter(gpu_share_milli=1000)

    def filter_runnable(self, queryset, name, value):
        if not value:
            return queryset
        types = list(queryset)
        keep = {row.instance_type.pk for row in hooks.availability(
            instance_types=types, prices=selectors.prices_in_force(instance_types=types)) if row.can_host}
        return queryset.filter(pk__in=keep)


class InstanceTypeViewSet(PublicReadViewSet):
    """Instance types with the price in force per region and kind, per hour and per BF16-TFLOPS-hour."""

    serializer_class = s.InstanceTypeSerializer
    filterset_class = InstanceTypeFilter
    ordering_fields = ["code", "gpu_count", "vcpus", "memory_gib"]

    def get_queryset(self):
        return selectors.instance_type_list()

    def _serialize(self, items: list[InstanceType], many: bool):
        # One query for every price shown, however many types the page has; availability in bulk too.
        prices = selectors.prices_in_force(instance_types=items)
        by_type: dict[int, list] = {}
        never: set[tuple[int, str]] = set()
        for row in hooks.availability(instance_types=items, prices=prices):
            if not row.can_host and self._runnable():
                never.add((row.instance_type.pk, row.region))  # hidden, with its prices
                continue
            by_type.setdefault(row.instance_type.pk, []).append(row)
        if never:
            prices = {pk: [p for p in rows if (pk, p.region) not in never] for pk, rows in prices.items()}
        context = {**self.get_serializer_context(), "prices": prices, "availability": by_type}
        return self.get_serializer(items if many else items[0], many=many, context=context).data

    def _runnable(self) -> bool:
        """`?runnable=true`: regions where the type could never run are left out too."""
        return self.request.query_params.get("runnable", "").lower() in ("true", "1")

    def list(self, request, *args, **kwargs):
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(self._serialize(list(page), many=True))

    def retrieve(self, request, *args, **kwargs):
        return Response(self._serialize([self.get_object()], many=False))


class PriceFilter(django_filters.FilterSet):
    instance_type = django_filters.ModelChoiceFilter(
        field_name="instance_type", to_field_name="code", queryset=InstanceType.objects.all()
    )
    region = django_filters.ModelChoiceFilter(field_name="region", to_field_name="code",
                                              queryset=Region.objects.all())
    kind = django_filters.ChoiceFilter(choices=PriceKind.choices)
    at = UtcIsoDateTimeFilter(field_name="effective_from", lookup_expr="lte",
                              label="Only prices announced to start by this time")

    class Meta:
        model = Price
        fields = ["instance_type", "region", "kind", "at"]


class PriceViewSet(PublicReadViewSet):
    """Every price row, history and announced changes included."""

    serializer_class = s.PriceSerializer
    filterset_class = PriceFilter
    lookup_field = "pk"
    lookup_value_regex = "[0-9]+"
    ordering_fields = ["effective_from", "per_hour"]

    def get_queryset(self):
        return selectors.price_list()


class QuotaApi(TenantMixin, ApiView):
    """The tenant's quotas beside current use."""

    permission_map = {"get": perms.QUOTAS_READ}

    @extend_schema(responses=s.QuotaSerializer(many=True), operation_id="quotas_list")
    def get(self, request):
        return Response(s.QuotaSerializer(selectors.quota_list(tenant=self.tenant), many=True).data)
