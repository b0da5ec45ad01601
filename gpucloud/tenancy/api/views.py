"""Tenancy API: the current tenant, members, invitations, API keys, audit events, sign-up."""
from __future__ import annotations

import django_filters
from django.contrib.auth import login
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, status
from rest_framework.decorators import action
from rest_framework.response import Response

from gpucloud.api.filters import UtcIsoDateTimeFilter
from gpucloud.api.throttling import PerKeyThrottle, SignupThrottle
from gpucloud.api.views import ApiView, TenantMixin, TenantViewSet
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy import selectors, services
from gpucloud.tenancy.api import serializers as s
from gpucloud.tenancy.choices import Scope
from gpucloud.tenancy.models import AuditEvent


class TenantApi(TenantMixin, ApiView):
    """The tenant this request acts for."""

    permission_map = {"get": perms.TENANT_READ, "patch": perms.TENANT_MANAGE}

    @extend_schema(responses=s.TenantSerializer, operation_id="tenant_retrieve")
    def get(self, request):
        return Response(s.TenantSerializer(self.tenant).data)

    @extend_schema(request=s.TenantUpdateSerializer, responses=s.TenantSerializer,
                   operation_id="tenant_update")
    def patch(self, request):
        ser = s.TenantUpdateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        tenant = services.tenant_update(tenant=self.tenant, name=ser.validated_data["name"])
        return Response(s.TenantSerializer(tenant).data)


class MyTenantsApi(ApiView):
    """The tenants the signed-in user belongs to, with their role (for switching tenant)."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(responses=s.MyTenantSerializer(many=True), operation_id="my_tenants_list")
    def get(self, request):
        memberships = selectors.membership_list_for_user(user=request.user)
        key = getattr(request, "api_key", None)
        if key is not None:  # a key sees only its own tenant
            memberships = memberships.filter(tenant_id=key.tenant_id)
        return Response(s.MyTenantSerializer(memberships, many=True).data)


class MemberViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                    TenantViewSet):
    serializer_class = s.MemberSerializer
    selector = selectors.member_list
    permission_map = {
        "list": perms.MEMBERS_READ, "retrieve": perms.MEMBERS_READ,
        "partial_update": perms.MEMBERS_MANAGE,
        "destroy": perms.MEMBERS_LEAVE,  # and members.manage to remove anybody else
    }
    ordering_fields = ["created_at", "role"]

    @extend_schema(request=s.MemberUpdateSerializer, responses=s.MemberSerializer)
    def partial_update(self, request, *args, **kwargs):
        """Change a member's role."""
        membership = self.get_object()
        ser = s.MemberUpdateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        membership = services.member_update_role(
            actor=self.membership, membership=membership, role=ser.validated_data["role"]
        )
        return Response(s.MemberSerializer(membership).data)

    def destroy(self, request, *args, **kwargs):
        """Remove a member (admins and owners), or leave the tenant (anyone, for themselves)."""
        membership = self.get_object()
        self.require(perms.to_remove_member(membership_id=membership.pk,
                                            own_membership_id=self.membership.pk))
        services.member_remove(actor=self.membership, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                        mixins.DestroyModelMixin, TenantViewSet):
    serializer_class = s.InvitationSerializer
    selector = selectors.invitation_list
    permission_map = {
        "list": perms.MEMBERS_READ, "retrieve": perms.MEMBERS_READ,
        "create": perms.MEMBERS_MANAGE, "destroy": perms.MEMBERS_MANAGE,
    }

    @extend_schema(request=s.InvitationCreateSerializer, responses={201: s.InvitationCreatedSerializer})
    def create(self, request, *args, **kwargs):
        ser = s.InvitationCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        invitation, token = services.invitation_create(actor=self.membership, **ser.validated_data)
        invitation.token = token
        return Response(s.InvitationCreatedSerializer(invitation).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, *args, **kwargs):
        """Revoke an invitation that has not been accepted."""
        services.invitation_revoke(invitation=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class InvitationAcceptApi(ApiView):
    """The signed-in user accepts an invitation sent to their email address."""

    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(request=s.InvitationAcceptSerializer, responses={201: s.MemberSerializer},
                   operation_id="invitation_accept")
    def post(self, request):
        ser = s.InvitationAcceptSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        membership = services.invitation_accept(token=ser.validated_data["token"], user=request.user)
        return Response(s.MemberSerializer(membership).data, status=status.HTTP_201_CREATED)


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    mixins.DestroyModelMixin, TenantViewSet):
    serializer_class = s.ApiKeySerializer
    selector = selectors.api_key_list
    permission_map = {
        "list": perms.API_KEYS_READ, "retrieve": perms.API_KEYS_READ,
        "create": perms.API_KEYS_CREATE,
        # and api_keys.manage to revoke anybody else's
        "destroy": perms.API_KEYS_REVOKE, "revoke": perms.API_KEYS_REVOKE,
    }
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "last_used_at", "name"]

    @extend_schema(request=s.ApiKeyCreateSerializer, responses={201: s.ApiKeyCreatedSerializer})
    def create(self, request, *args, **kwargs):
        ser = s.ApiKeyCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        key, secret = services.api_key_create(membership=self.membership, **ser.validated_data)
        key.secret = secret
        return Response(s.ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)

    def _revoke(self):
        key = self.get_object()
        self.require(perms.to_revoke_key(created_by_id=key.created_by_id, user_id=self.request.user.pk))
        return services.api_key_revoke(key=key)

    def destroy(self, request, *args, **kwargs):
        """Revoke the key (it stays listed, with `revoked_at`, for the audit trail)."""
        self._revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=s.ApiKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, *args, **kwargs):
        """Revoke the key and return it."""
        return Response(s.ApiKeySerializer(self._revoke()).data)


class AuditEventFilter(django_filters.FilterSet):
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    action = django_filters.CharFilter(lookup_expr="startswith", max_length=64)
    actor = django_filters.CharFilter(lookup_expr="icontains", max_length=200)

    class Meta:
        model = AuditEvent
        fields = ["object_type", "object_id"]


class AuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantViewSet):
    """The tenant's audit trail, newest first."""

    serializer_class = s.AuditEventSerializer
    selector = selectors.audit_event_list
    permission_map = {"list": perms.AUDIT_READ, "retrieve": perms.AUDIT_READ}
    filterset_class = AuditEventFilter
    ordering_fields = ["created_at"]


class SignupApi(ApiView):
    """Create an account and a tenant you own; signs you in.

    The tenant's sign-up credit comes once the emailed link confirms the address. Refused
    with 403 `signup_closed` when OPEN_SIGNUP is off; at most SIGNUP_RATE_LIMIT a client address.
    """

    permission_classes = [permissions.AllowAny]
    authentication_classes = []  # no session yet, so no CSRF to check
    throttle_scope = "per_key"
    throttle_classes = [PerKeyThrottle, SignupThrottle]

    @extend_schema(request=s.SignupSerializer, responses={201: s.SignupResultSerializer},
                   auth=[], operation_id="signup")
    def post(self, request):
        ser = s.SignupSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        user, tenant = services.user_signup(
            email=data["email"], password=data["password"], tenant_name=data["tenant_name"],
            full_name=data["name"],
        )
        services.email_verification_send(
            user=user, verify_url=request.build_absolute_uri(reverse("console:verify_email")))
        secret = None
        if data["create_api_key"]:
            membership = selectors.membership_get(user=user, tenant=tenant)
            _, secret = services.api_key_create(
                membership=membership, name="initial key", scopes=[Scope.ADMIN]
            )
        login(request._request, user, backend="django.contrib.auth.backends.ModelBackend")
        request.session["tenant_id"] = str(tenant.pk)
        body = {"user": s.UserSerializer(user).data, "tenant": s.TenantSerializer(tenant).data,
                "api_key": secret, "email_verified": False}
        return Response(body, status=status.HTTP_201_CREATED)
