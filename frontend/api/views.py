"""/api/v1/ssh-keys: a user's saved SSH public keys in the current tenant.

Keys are personal: each user sees and removes only their own, within the tenant the
request acts for (another user's or another tenant's key answers 404). They are what
the gateway accepts for `ssh <instance>@gateway` (with `workloads.connect`), beside the
keys given at launch (docs/connect.md).
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.response import Response

from frontend.api import serializers as s
from gpucloud.api.views import TenantViewSet
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy import selectors, services


class SshKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    mixins.DestroyModelMixin, TenantViewSet):
    serializer_class = s.SshKeySerializer
    permission_map = {
        "list": perms.SSH_KEYS_READ, "retrieve": perms.SSH_KEYS_READ,
        "create": perms.SSH_KEYS_MANAGE, "destroy": perms.SSH_KEYS_MANAGE,
    }
    lookup_value_regex = "[0-9]+"
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset_model().objects.none()
        return selectors.ssh_key_list(tenant=self.tenant, user=self.request.user)

    @extend_schema(request=s.SshKeyCreateSerializer, responses={201: s.SshKeySerializer})
    def create(self, request, *args, **kwargs):
        ser = s.SshKeyCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        key = services.ssh_key_add(membership=self.membership, **ser.validated_data)
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        services.ssh_key_remove(key=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
