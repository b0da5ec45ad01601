"""Alarms API: CRUD over the tenant's alarms and each alarm's history (state changes and their actions)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from alarms import selectors, services
from alarms.api import serializers as s
from gpucloud.api.views import TenantViewSet
from gpucloud.tenancy import permissions as perms


class AlarmViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantViewSet):
    """CloudWatch-style alarms on a workload's GPU metrics or the tenant's spend and queue."""

    selector = selectors.alarm_list
    serializer_class = s.AlarmSerializer
    permission_map = {"list": perms.WORKLOADS_READ, "retrieve": perms.WORKLOADS_READ, "history": perms.WORKLOADS_READ,
                      "create": perms.WORKLOADS_MANAGE, "update": perms.WORKLOADS_MANAGE,
                      "partial_update": perms.WORKLOADS_MANAGE, "destroy": perms.WORKLOADS_MANAGE}
    ordering_fields = ["name", "created_at", "state", "state_changed_at"]

    @extend_schema(request=s.AlarmWriteSerializer, responses={201: s.AlarmCreatedSerializer})
    def create(self, request, *args, **kwargs):
        ser = s.AlarmWriteSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        alarm, secret = services.alarm_create(tenant=self.tenant, **ser.validated_data)
        alarm.webhook_secret = secret
        return Response(s.AlarmCreatedSerializer(alarm).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.AlarmWriteSerializer, responses=s.AlarmSerializer)
    def update(self, request, *args, **kwargs):
        alarm = self.get_object()
        ser = s.AlarmWriteSerializer(data=request.data, partial=kwargs.get("partial", False))
        ser.is_valid(raise_exception=True)
        alarm = services.alarm_update(alarm=alarm, **ser.validated_data)
        return Response(s.AlarmSerializer(alarm).data)

    @extend_schema(request=s.AlarmWriteSerializer, responses=s.AlarmSerializer)
    def partial_update(self, request, *args, **kwargs):
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request, *args, **kwargs):
        services.alarm_delete(alarm=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.AlarmHistorySerializer(many=True))
    @action(detail=True, methods=["get"])
    def history(self, request, *args, **kwargs):
        """The alarm's state changes, newest first, with the reason, the datapoints and each action's log."""
        rows = selectors.alarm_history_list(alarm=self.get_object())
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.AlarmHistorySerializer(page, many=True).data)
