"""Notifications API: your inbox in this tenant, marking it read, and what you are told of how."""
from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucloud.api.views import ApiView, TenantMixin, TenantViewSet
from gpucloud.tenancy import permissions as perms
from notifications import selectors, services
from notifications.api import serializers as s
from notifications.models import Notification


class NotificationFilter(django_filters.FilterSet):
    unread = django_filters.BooleanFilter(field_name="read_at", lookup_expr="isnull",
                                          help_text="true: only the unread ones; false: only those read")

    class Meta:
        model = Notification
        fields = ["unread"]


class NotificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """Your own notifications in this tenant, newest first (never another member's)."""

    serializer_class = s.NotificationSerializer
    filterset_class = NotificationFilter
    lookup_value_regex = "[0-9]+"
    permission_map = {"list": perms.NOTIFICATIONS_READ, "retrieve": perms.NOTIFICATIONS_READ,
                      "read": perms.NOTIFICATIONS_MANAGE}

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset_model().objects.none()
        return selectors.notification_list(user=self.request.user, tenant=self.tenant)

    @extend_schema(request=s.MarkReadSerializer, responses=s.MarkedSerializer)
    @action(detail=False, methods=["post"])
    def read(self, request, *args, **kwargs):
        """Mark notifications read: the ids given, or all of yours in this tenant."""
        ser = s.MarkReadSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        n = services.notifications_mark_read(user=request.user, tenant=self.tenant, ids=ser.validated_data.get("ids"))
        return Response({"marked": n})


class NotificationSettingsApi(TenantMixin, ApiView):
    """What you are told of in this tenant, and how: the console inbox, e-mail, a signed webhook."""

    permission_map = {"get": perms.NOTIFICATIONS_READ, "put": perms.NOTIFICATIONS_MANAGE}

    @extend_schema(responses=s.SettingsSerializer, operation_id="notification_settings_retrieve")
    def get(self, request):
        return Response(s.SettingsSerializer(selectors.settings_for(user=request.user, tenant=self.tenant)).data)

    @extend_schema(request=s.SettingsWriteSerializer, responses=s.SettingsUpdatedSerializer,
                   operation_id="notification_settings_update")
    def put(self, request):
        ser = s.SettingsWriteSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        settings, secret = services.notification_settings_update(user=request.user, tenant=self.tenant,
                                                                 **ser.validated_data)
        settings.webhook_secret = secret
        return Response(s.SettingsUpdatedSerializer(settings).data)
