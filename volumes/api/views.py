"""/api/v1/volumes: create, list, get, grow (PATCH), delete when detached."""
from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.response import Response

from gpucloud.api.views import TenantViewSet
from gpucloud.tenancy import permissions as perms
from volumes import selectors, services
from volumes.api import serializers as s
from volumes.models import Volume


class VolumeFilter(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains", max_length=100)

    class Meta:
        model = Volume
        fields = ["name"]


class VolumeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Persistent volumes: attach them at launch (`volumes` on an instance or job), one writer
    at a time; the data lives on one host and outlives the work (docs/volumes.md)."""

    selector = selectors.volume_list
    serializer_class = s.VolumeSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    permission_map = {
        "list": perms.WORKLOADS_READ, "retrieve": perms.WORKLOADS_READ,
        "create": perms.WORKLOADS_LAUNCH, "partial_update": perms.WORKLOADS_MANAGE,
        "destroy": perms.WORKLOADS_MANAGE,
    }
    filterset_class = VolumeFilter
    ordering_fields = ["created_at", "name", "size_gib"]

    def get_serializer_class(self):
        return s.VolumeDetailSerializer if self.action == "retrieve" else s.VolumeSerializer

    def _detail(self, volume, code=status.HTTP_200_OK) -> Response:
        fresh = selectors.volume_list(tenant=self.tenant).get(pk=volume.pk)
        return Response(s.VolumeDetailSerializer(fresh).data, status=code)

    @extend_schema(request=s.VolumeCreateSerializer, responses={201: s.VolumeDetailSerializer})
    def create(self, request, *args, **kwargs):
        ser = s.VolumeCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        volume = services.volume_create(tenant=self.tenant, user=request.user, **ser.validated_data)
        return self._detail(volume, status.HTTP_201_CREATED)

    @extend_schema(request=s.VolumeResizeSerializer, responses=s.VolumeDetailSerializer)
    def partial_update(self, request, *args, **kwargs):
        volume = self.get_object()
        ser = s.VolumeResizeSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        services.volume_resize(volume=volume, size_gib=ser.validated_data["size_gib"])
        return self._detail(volume)

    @extend_schema(responses={204: None})
    def destroy(self, request, *args, **kwargs):
        """Delete a detached volume: gone at once for you and no longer billed; its data is
        purged from the host after a grace period. Refused (409 volume_attached) while attached."""
        services.volume_delete(volume=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
