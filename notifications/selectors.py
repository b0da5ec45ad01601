"""Reads: a person's inbox in one tenant, their settings, and who hears of what."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import Membership, Tenant
from notifications.choices import DEFAULT_CHANNELS, Scope
from notifications.models import Notification, NotificationSettings


def notification_list(*, user, tenant: Tenant | None, unread: bool = False) -> QuerySet[Notification]:
    """The person's inbox in `tenant` (None: their operator inbox). Never another person's."""
    qs = Notification.objects.filter(user=user, tenant=tenant, in_inbox=True)
    return qs.filter(read_at__isnull=True) if unread else qs


def notification_unread_count(*, user, tenant: Tenant | None) -> int:
    return notification_list(user=user, tenant=tenant, unread=True).count()


def settings_for(*, user, tenant: Tenant | None) -> NotificationSettings:
    """The person's settings, or the defaults (unsaved) when they never changed any."""
    found = NotificationSettings.objects.filter(user=user, tenant=tenant).first()
    return found or NotificationSettings(user=user, tenant=tenant, scope=default_scope(user=user, tenant=tenant))


def default_scope(*, user, tenant: Tenant | None) -> str:
    """Owners and admins hear of all of the tenant's work; others of their own."""
    if tenant is None:
        return Scope.ALL
    role = Membership.objects.filter(user=user, tenant=tenant).values_list("role", flat=True).first()
    return Scope.ALL if role in (Role.OWNER, Role.ADMIN) else Scope.MINE


def channels_for(s: NotificationSettings, event: str) -> tuple[str, ...]:
    chosen = (s.channels or {}).get(event)
    return tuple(chosen) if chosen is not None else DEFAULT_CHANNELS[event]


def tenant_audience(*, tenant_ids: set) -> dict:
    """tenant id -> [(user, role)] of its active members."""
    out: dict = {t: [] for t in tenant_ids}
    for m in (Membership.objects.filter(tenant_id__in=tenant_ids, user__is_active=True)
              .select_related("user").order_by("pk")):
        out[m.tenant_id].append((m.user, m.role))
    return out


def operators() -> list:
    return list(get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk"))
