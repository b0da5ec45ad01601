"""Autoscaling groups, their scaling policies and scheduled actions (docs/autoscaling.md)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.response import Response

from autoscaling import selectors, services
from autoscaling.api import serializers as s
from gpucloud.api.views import TenantViewSet
from gpucloud.tenancy import permissions as perms

_METHODS = ["get", "post", "patch", "delete", "head", "options"]
_PERMS = {"list": perms.WORKLOADS_READ, "retrieve": perms.WORKLOADS_READ, "create": perms.WORKLOADS_LAUNCH,
          "partial_update": perms.WORKLOADS_LAUNCH, "destroy": perms.WORKLOADS_MANAGE}


class AutoscalingGroupViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Groups of identical instances kept at a desired size: by hand, by policies, by schedule, or
    by a job queue (batch pools). Members are ordinary instances."""

    selector = selectors.group_list
    serializer_class = s.GroupSerializer
    http_method_names = _METHODS
    permission_map = {**_PERMS, "activities": perms.WORKLOADS_READ, "protection": perms.WORKLOADS_MANAGE}

    def _detail(self, group, code=status.HTTP_200_OK) -> Response:
        fresh = selectors.group_get(tenant=self.tenant, pk=group.pk)
        return Response(s.GroupSerializer(fresh).data, status=code)

    @extend_schema(request=s.GroupCreateSerializer, responses={201: s.GroupSerializer})
    def create(self, request, *args, **kwargs):
        """Create a group; it launches `desired` members at once (at least `min_size`)."""
        ser = s.GroupCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        group = services.group_create(tenant=self.tenant, user=request.user, **ser.validated_data)
        return self._detail(group, status.HTTP_201_CREATED)

    @extend_schema(request=s.GroupUpdateSerializer, responses=s.GroupSerializer)
    def partial_update(self, request, *args, **kwargs):
        """Change sizes (desired by hand), the billing mix or the template's image; new members use it."""
        group = self.get_object()
        ser = s.GroupUpdateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        group = services.group_update(group=group, **ser.validated_data)
        return self._detail(group)

    def destroy(self, request, *args, **kwargs):
        """Delete the group: its members are stopped (they stay in your instance list, stopped)."""
        services.group_delete(group=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.ActivitySerializer(many=True))
    @action(detail=True, methods=["get"])
    def activities(self, request, *args, **kwargs):
        """What the group did and why, newest first."""
        group = self.get_object()
        page = self.paginate_queryset(selectors.activity_list(group=group))
        return self.get_paginated_response(s.ActivitySerializer(page, many=True).data)

    @extend_schema(request=s.ProtectionSerializer, responses=s.GroupMemberSerializer)
    @action(detail=True, methods=["post"])
    def protection(self, request, *args, **kwargs):
        """Turn scale-in protection of one member on or off."""
        group = self.get_object()
        ser = s.ProtectionSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        member = services.member_protect(group=group, instance_id=ser.validated_data["instance"],
                                         protected=ser.validated_data["protected"])
        member.refresh_from_db()
        return Response(s.GroupMemberSerializer(member).data)


class _GroupPartViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """A resource that belongs to one of the tenant's groups (named by `group` when created)."""

    http_method_names = _METHODS
    permission_map = _PERMS
    create_serializer: type
    update_serializer: type

    def _create(self, group, data):
        raise NotImplementedError

    def _update(self, obj, data):
        raise NotImplementedError

    def _delete(self, obj) -> None:
        raise NotImplementedError

    def create(self, request, *args, **kwargs):
        ser = self.create_serializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = dict(ser.validated_data)
        group = selectors.group_get(tenant=self.tenant, pk=data.pop("group"))
        return Response(self.serializer_class(self._create(group, data)).data, status=status.HTTP_201_CREATED)

    def partial_update(self, request, *args, **kwargs):
        obj = self.get_object()
        ser = self.update_serializer(data=request.data)
        ser.is_valid(raise_exception=True)
        return Response(self.serializer_class(self._update(obj, ser.validated_data)).data)

    def destroy(self, request, *args, **kwargs):
        self._delete(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    create=extend_schema(request=s.PolicyCreateSerializer, responses={201: s.PolicySerializer}),
    partial_update=extend_schema(request=s.PolicyUpdateSerializer, responses=s.PolicySerializer),
)
class ScalingPolicyViewSet(_GroupPartViewSet):
    """Target tracking (kept by the group at each evaluation) and step scaling (run by alarms)."""

    selector = selectors.policy_list
    serializer_class = s.PolicySerializer
    create_serializer = s.PolicyCreateSerializer
    update_serializer = s.PolicyUpdateSerializer

    def _create(self, group, data):
        return services.policy_create(group=group, **data)

    def _update(self, obj, data):
        return services.policy_update(policy=obj, **data)

    def _delete(self, obj) -> None:
        services.policy_delete(policy=obj)


@extend_schema_view(
    create=extend_schema(request=s.ScheduledCreateSerializer, responses={201: s.ScheduledActionSerializer}),
    partial_update=extend_schema(request=s.ScheduledWriteSerializer, responses=s.ScheduledActionSerializer),
)
class ScheduledActionViewSet(_GroupPartViewSet):
    """Cron-timed changes of a group's min, max and desired, in a time zone."""

    selector = selectors.scheduled_list
    serializer_class = s.ScheduledActionSerializer
    create_serializer = s.ScheduledCreateSerializer
    update_serializer = s.ScheduledWriteSerializer

    def _create(self, group, data):
        return services.scheduled_create(group=group, **data)

    def _update(self, obj, data):
        return services.scheduled_update(action=obj, **data)

    def _delete(self, obj) -> None:
        services.scheduled_delete(action=obj)
