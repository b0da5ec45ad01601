"""Reads for tenancy. Tenant-owned rows are only ever read through a `tenant=` argument."""
from __future__ import annotations

from django.db.models import QuerySet
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import ApiKey, AuditEvent, EmailVerification, Invitation, Membership, SshKey, Tenant


def membership_get(*, user, tenant: Tenant) -> Membership | None:
    if user is None or not user.is_authenticated:
        return None
    return Membership.objects.select_related("tenant").filter(user=user, tenant=tenant).first()


def tenant_admin_emails(*, tenant: Tenant) -> list[str]:
    """The owners' and admins' addresses: who hears of budgets, balances and auto-stops."""
    return sorted({e for e in Membership.objects.filter(tenant=tenant, role__in=[Role.OWNER, Role.ADMIN])
                   .values_list("user__email", flat=True) if e})


def membership_list_for_user(*, user) -> QuerySet[Membership]:
    return Membership.objects.select_related("tenant").filter(user=user).order_by("tenant__name")


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
