"""Reads for tenancy. Tenant-owned rows are only ever read through a `tenant=` argument."""
from __future__ import annotations

from collections.abc import Iterable

from django.db.models import QuerySet
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import ApiKey, AuditEvent, EmailVerification, Invitation, Membership, SshKey, Tenant


def membership_get(*, user, tenant: Tenant) -> Membership | None:
    if user is None or not user.is_authenticated:
        return None
    return Membership.objects.select_related("tenant").filter(user=user, tenant=tenant).first()


def member_permissions(*, membership: Membership | None, scopes: Iterable[str] | None = None) -> frozenset[str]:
    """What `membership`'s user may do in its tenant now: the one authorisation rule of every
    face (the console, the API, the gateway's HTTP proxy and SSH, and their re-checks).

    Nothing for no membership (never a member, or removed) or a deactivated user
    (`is_active=False`); else the matrix (`permissions.effective_permissions`): the role,
    narrowed by an API key's `scopes` (None for a session) and the tenant's suspension.
    Reads `membership.user` and `membership.tenant`: select them with it.
    """
    if membership is None or not membership.user.is_active:
        return frozenset()
    return perms.effective_permissions(role=membership.role, scopes=scopes,
                                       suspended=membership.tenant.is_suspended)


def member_may(*, user_id: int, tenant_id: object, permission: str, scopes: Iterable[str] | None = None) -> bool:
    """Whether the user is an active member of the tenant holding `permission` (`member_permissions`)."""
    membership = (Membership.objects.select_related("user", "tenant")
                  .filter(tenant_id=tenant_id, user_id=user_id).first())
    return permission in member_permissions(membership=membership, scopes=scopes)


def members_who_may(*, pairs: Iterable[tuple[str, int]], permission: str) -> set[tuple[str, int]]:
    """Of (tenant id, user id) pairs, those whose user holds `permission` there by session
    (`member_permissions`): one query for any number, for the gateway's re-checks."""
    pairs = set(pairs)
    rows = Membership.objects.select_related("user", "tenant").filter(user_id__in={u for _, u in pairs})
    return {(str(m.tenant_id), m.user_id) for m in rows
            if (str(m.tenant_id), m.user_id) in pairs and permission in member_permissions(membership=m)}


def tenant_admin_emails(*, tenant: Tenant) -> list[str]:
    """The owners' and admins' addresses: who hears of budgets, balances and auto-stops."""
    return sorted({e for e in Membership.objects.filter(tenant=tenant, role__in=[Role.OWNER, Role.ADMIN])
                   .values_list("user__email", flat=True) if e})


def membership_list_for_user(*, user) -> QuerySet[Membership]:
    return Membership.objects.select_related("tenant", "user").filter(user=user).order_by("tenant__name")


def member_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return Membership.objects.for_tenant(tenant).select_related("user")


def invitation_list(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.for_tenant(tenant).select_related("invited_by")


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.for_tenant(tenant).select_related("created_by")


def audit_event_list(*, tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.for_tenant(tenant)


def email_verification_pending(*, user) -> EmailVerification | None:
    """The user's unconfirmed sign-up address, if any (their tenant waits for its credit)."""
    if user is None or not user.is_authenticated:
        return None
    return EmailVerification.objects.filter(user=user, verified_at__isnull=True).first()


def totp_device_for(*, user, confirmed: bool = True) -> TOTPDevice | None:
    """The user's TOTP device (one a user): the confirmed one, or the one being set up."""
    if user is None or not user.is_authenticated:
        return None
    return TOTPDevice.objects.filter(user=user, confirmed=confirmed).order_by("-pk").first()


def ssh_key_list(*, tenant: Tenant, user) -> QuerySet[SshKey]:
    """The user's saved SSH keys in this tenant (keys are personal, not shared)."""
    return SshKey.objects.for_tenant(tenant).filter(user=user)
