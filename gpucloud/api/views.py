"""Base classes of every API view. Tenant scoping and permissions live here, once.

A tenant-scoped view declares
  * `selector`: a function `(*, tenant) -> QuerySet` (tenancy/catalogue selectors), and
  * `permission_map`: {action: permission name} from gpucloud.tenancy.permissions.
It never writes its own `get_queryset` filter: rows of another tenant are simply
not in the queryset, so they answer 404, never 403.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.db.models import QuerySet
from rest_framework import exceptions, permissions, viewsets
from rest_framework.request import Request
from rest_framework.views import APIView

from gpucloud.api.scopes import check_key_scope
from gpucloud.lib.http import client_ip
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.audit import Actor, reset_actor, set_actor
from gpucloud.tenancy.models import Membership, Tenant
from gpucloud.tenancy.selectors import member_permissions, membership_list_for_user

TENANT_HEADER = "HTTP_X_TENANT"


def resolve_tenant(request: Request) -> Membership | None:
    """The membership this request acts through.

    An API key belongs to one tenant. A browser session picks its tenant with
    the `X-Tenant` header (slug or id), else the one stored in the session,
    else the user's first tenant.
    """
    key = getattr(request, "api_key", None)
    user = request.user
    if not user or not user.is_authenticated:
        return None
    if key is not None:
        # the key's creator's membership of the key's tenant, read with the key (api_key_check)
        if hasattr(key, "membership"):
            return key.membership
        m = Membership.objects.filter(user=user, tenant_id=key.tenant_id).first()
        if m is not None:
            m.tenant = key.tenant
        return m
    memberships = list(membership_list_for_user(user=user))
    wanted = request.META.get(TENANT_HEADER) or request.session.get("tenant_id")
    if wanted:
        for m in memberships:
            if wanted in (m.tenant.slug, str(m.tenant_id)):
                return m
        if request.META.get(TENANT_HEADER):
            raise exceptions.NotFound("No such tenant among yours.", code="tenant_not_found")
    return memberships[0] if memberships else None


class ApiView(APIView):
    """Sets the audit actor for the request and holds API keys to their route's scope."""

    def dispatch(self, request, *args, **kwargs):
        token = set_actor(Actor(ip=client_ip(request)))
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            reset_actor(token)

    def perform_authentication(self, request: Request) -> None:
        super().perform_authentication(request)
        user = request.user if request.user and request.user.is_authenticated else None
        set_actor(Actor(user=user, api_key=getattr(request, "api_key", None), ip=client_ip(request)))

    def check_permissions(self, request: Request) -> None:
        super().check_permissions(request)  # first, so a role's refusal is told as such
        # Then, on every route: a key's scopes bound what it may do, also where no tenant
        # permission applies or it is decided per object (gpucloud/api/scopes.py).
        check_key_scope(request)


class TenantPermission(permissions.BasePermission):
    """Allows an action when the actor's effective permissions include the view's requirement."""

    def has_permission(self, request, view) -> bool:
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        if view.get_membership() is None:
            raise exceptions.PermissionDenied("You are not a member of any tenant.", code="no_tenant")
        required = view.required_permission()
        if required is not None:
            view.require(required)
        return True


class TenantMixin:
    """Tenant context for a view: `self.tenant`, `self.membership`, `self.require(perm)`."""

    permission_classes: ClassVar[list[type]] = [TenantPermission]
    permission_map: ClassVar[dict[str, str | None]] = {}
    request: Request

    def get_membership(self) -> Membership | None:
        if not hasattr(self, "_membership"):
            self._membership = resolve_tenant(self.request)
        return self._membership

    @property
    def membership(self) -> Membership:
        membership = self.get_membership()
        assert membership is not None  # TenantPermission ran first
        return membership

    @property
    def tenant(self) -> Tenant:
        return self.membership.tenant

    @property
    def granted(self) -> frozenset[str]:
        """The actor's effective permissions: role, narrowed by key scopes and suspension."""
        key = getattr(self.request, "api_key", None)
        return member_permissions(membership=self.membership, scopes=key.scopes if key is not None else None)

    def require(self, permission: str) -> None:
        """Raise the 403 that explains why, unless the actor holds `permission`."""
        if permission in self.granted:
            return
        if self.tenant.is_suspended and permission in perms.SUSPENDED_DENIED:
            raise exceptions.PermissionDenied(
                "This tenant is suspended: it can read and stop work, but not launch.",
                code="tenant_suspended",
            )
        key = getattr(self.request, "api_key", None)
        if key is not None and permission in perms.ROLE_PERMISSIONS.get(self.membership.role, ()):
            raise exceptions.PermissionDenied(
                f"This API key's scopes ({', '.join(key.scopes)}) do not allow {permission}.",
                code="insufficient_scope",
            )
        raise exceptions.PermissionDenied(
            f"Your role ({self.membership.role}) does not allow {permission}."
        )

    def required_permission(self) -> str | None:
        method = self.request.method.lower()
        if not hasattr(self, "action"):  # a plain APIView: its handlers are its methods
            action = method if hasattr(self, method) else None
        else:
            action = self.action
        if action is None or method == "options" or method not in self.http_method_names:
            return None  # the method has no handler here: DRF answers 405 next
        if action not in self.permission_map:
            # Forgetting to declare a permission must deny, not allow.
            raise exceptions.PermissionDenied(f"No permission is declared for {action}.")
        return self.permission_map[action]


class TenantViewSet(TenantMixin, ApiView, viewsets.GenericViewSet):
    """A viewset over one tenant's rows, read through `selector(tenant=...)`."""

    selector: ClassVar[Callable[..., QuerySet[Any]]]
    lookup_value_regex = "[0-9a-fA-F-]{36}"

    def get_queryset(self) -> QuerySet[Any]:
        if getattr(self, "swagger_fake_view", False):  # schema generation has no tenant
            return self.queryset_model().objects.none()
        return type(self).selector(tenant=self.tenant)

    @classmethod
    def queryset_model(cls):
        return cls.serializer_class.Meta.model


class PublicReadViewSet(ApiView, viewsets.ReadOnlyModelViewSet):
    """The catalogue: anyone may read it, signed in or not (prices are public)."""

    permission_classes = [permissions.AllowAny]
    lookup_field = "code"
    lookup_value_regex = "[A-Za-z0-9][A-Za-z0-9.-]*"
