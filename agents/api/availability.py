"""GET /api/v1/availability: per instance type and region, what would start now for your tenant."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from agents import selectors
from gpucloud.api.serializers import StrictQuerySerializer
from gpucloud.api.views import ApiView, TenantMixin
from gpucloud.catalogue.selectors import instance_type_list
from gpucloud.tenancy import permissions as perms
from scheduler.core.blockers import AVAILABILITIES


class AvailabilityQuerySerializer(StrictQuerySerializer):
    region = serializers.CharField(required=False, max_length=32, help_text="only this region")
    gpu_model = serializers.CharField(required=False, max_length=32, help_text="only this GPU model, e.g. H100")
    instance_type = serializers.CharField(required=False, max_length=48, help_text="only this type")
    available = serializers.BooleanField(required=False, default=False,
                                         help_text="only rows with at least one launch that would start now")
    runnable = serializers.BooleanField(required=False, default=False,
                                        help_text="hide what no host of the region could ever run "
                                                  "(availability never)")


class AvailabilitySerializer(serializers.Serializer):
    instance_type = serializers.CharField(source="instance_type.code")
    gpu_model = serializers.CharField(source="instance_type.gpu_model.code")
    region = serializers.CharField()
    available_now = serializers.IntegerField(
        help_text=f"one-node launches that the next scheduling cycle would start now (at most "
                  f"{selectors.AVAILABILITY_COUNT_MAX}); launches past it queue")
    can_host = serializers.BooleanField(help_text="whether some host of the region could ever run one")
    reason = serializers.CharField(help_text="why it never could (launching it answers 409 unsatisfiable); "
                                             "empty when it can")
    availability = serializers.ChoiceField(
        choices=AVAILABILITIES, read_only=True,
        help_text="available: available_now > 0; busy: some host could run it, none is free now (a launch "
                  "queues); never: no host of the region could ever run it (a launch is refused)")


def availability_rows(*, query: dict, tenant=None) -> list[selectors.Availability]:
    types = instance_type_list()
    if query.get("gpu_model"):
        types = types.filter(gpu_model__code=query["gpu_model"])
    if query.get("instance_type"):
        types = types.filter(code=query["instance_type"])
    rows = selectors.availability(instance_types=list(types), tenant=tenant,
                                  region_codes=[query["region"]] if query.get("region") else None)
    if query.get("available"):
        rows = [r for r in rows if r.available_now > 0]
    if query.get("runnable"):
        rows = [r for r in rows if r.can_host]
    # what can start now first, most first; then the rest by type and region
    return sorted(rows, key=lambda r: (r.available_now == 0, -r.available_now, r.instance_type.code, r.region))


class AvailabilityApi(TenantMixin, ApiView):
    """What your tenant could start now, per instance type and region where it is priced, counted by
    the scheduler itself (queue ahead, GPU sharing, your quotas and budget), and whether the
    region's fleet could ever run it."""

    permission_map = {"get": perms.WORKLOADS_READ}

    @extend_schema(
        parameters=[AvailabilityQuerySerializer],
        responses=AvailabilitySerializer(many=True), operation_id="api_v1_availability_list",
    )
    def get(self, request):
        q = AvailabilityQuerySerializer(data=request.query_params.dict())
        q.is_valid(raise_exception=True)
        rows = availability_rows(query=q.validated_data, tenant=self.tenant)
        return Response(AvailabilitySerializer(rows, many=True).data)
