"""Writes for tenancy: sign-up, members, invitations, API keys, suspension.

Every service that changes something records an audit event in the same transaction.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from gpucloud.lib.errors import Conflict, Forbidden, InvalidInput, NotFoundError
from gpucloud.tenancy import permissions
from gpucloud.tenancy.audit import Actor, acting_as, audit_record, current_actor
from gpucloud.tenancy.choices import Role, Scope, TenantStatus
from gpucloud.tenancy.models import ApiKey, AuditEvent, Invitation, Membership, Tenant

User = get_user_model()

API_KEY_PREFIX = "gpc_"
# 8 random characters name the key (shown forever), 40 are the secret (shown once).
_PREFIX_CHARS = 8
_SECRET_BYTES = 30


def _hash(secret: str) -> str:
    # Keys and tokens are 240-bit random strings, not passwords: a plain SHA-256
    # cannot be brute-forced, and a slow KDF would cost every API request.
    return hashlib.sha256(secret.encode()).hexdigest()


# ---------------------------------------------------------------- tenants


def _unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "tenant"
    slug = base
    while Tenant.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


@transaction.atomic
def tenant_create(*, name: str, owner, plan: str | None = None) -> Tenant:
    name = name.strip()
    if not name:
        raise InvalidInput("A tenant needs a name.", fields={"tenant_name": ["This field may not be blank."]})
    tenant = Tenant.objects.create(
        name=name, slug=_unique_slug(name), plan=plan or settings.DEFAULT_PLAN
    )
    Membership.objects.create(tenant=tenant, user=owner, role=Role.OWNER)
    audit_record(tenant=tenant, action="tenant.create", obj=tenant)
    from billing.services import signup_credit_grant  # billing builds on tenancy, not back

    signup_credit_grant(tenant=tenant)
    return tenant


@transaction.atomic
def user_signup(*, email: str, password: str, tenant_name: str, full_name: str = ""):
    """Create a user and a tenant that the user owns. Returns (user, tenant)."""
    email = User.objects.normalize_email(email).lower()
    if User.objects.filter(email__iexact=email).exists() or User.objects.filter(
        username__iexact=email
    ).exists():
        raise Conflict(
            "An account with this email already exists.",
            code="email_taken",
            fields={"email": ["An account with this email already exists."]},
        )
    first, _, last = full_name.strip().partition(" ")
    user = User(username=email, email=email, first_name=first[:150], last_name=last[:150])
    try:
        validate_password(password, user)
    except DjangoValidationError as exc:
        raise InvalidInput("The password is too weak.", fields={"password": list(exc.messages)}) from None
    user.set_password(password)
    user.save()
    # From here on the new user is the actor in the audit trail.
    with acting_as(Actor(user=user, ip=current_actor().ip)):
        audit_record(tenant=None, action="user.signup", obj=user, object_repr=email)
        tenant = tenant_create(name=tenant_name, owner=user)
    return user, tenant


@transaction.atomic
def tenant_update(*, tenant: Tenant, name: str) -> Tenant:
    old = tenant.name
    tenant.name = name.strip()
    tenant.save(update_fields=["name"])
    audit_record(tenant=tenant, action="tenant.update", obj=tenant, data={"name": [old, tenant.name]})
    return tenant


@transaction.atomic
def tenant_suspend(*, tenant: Tenant, reason: str) -> Tenant:
    """Operators suspend a tenant: it can still read and stop work, but not launch."""
    updated = Tenant.objects.filter(pk=tenant.pk, status=TenantStatus.ACTIVE).update(
        status=TenantStatus.SUSPENDED, suspended_reason=reason[:300]
    )
    tenant.refresh_from_db()
    if updated:
        audit_record(tenant=tenant, action="tenant.suspend", obj=tenant, data={"reason": reason})
    return tenant


@transaction.atomic
def tenant_reactivate(*, tenant: Tenant) -> Tenant:
    updated = Tenant.objects.filter(pk=tenant.pk, status=TenantStatus.SUSPENDED).update(
        status=TenantStatus.ACTIVE, suspended_reason=""
    )
    tenant.refresh_from_db()
    if updated:
        audit_record(tenant=tenant, action="tenant.reactivate", obj=tenant)
    return tenant


# ---------------------------------------------------------------- members


def _owner_count(tenant: Tenant) -> int:
    return Membership.objects.filter(tenant=tenant, role=Role.OWNER).count()


def _check_can_manage(*, actor: Membership, target: Membership) -> None:
    if not permissions.can_grant_role(actor_role=actor.role, role=target.role):
        raise Forbidden(f"Only an owner can change or remove an {target.role}.")


@transaction.atomic
def member_update_role(*, actor: Membership, membership: Membership, role: str) -> Membership:
    # Lock the tenant's memberships so two demotions cannot leave it without an owner.
    list(Membership.objects.select_for_update().filter(tenant=membership.tenant))
    membership.refresh_from_db()
    _check_can_manage(actor=actor, target=membership)
    if not permissions.can_grant_role(actor_role=actor.role, role=role):
        raise Forbidden(f"You cannot grant the role {role}.", fields={"role": ["Above your own role."]})
    if membership.role == Role.OWNER and role != Role.OWNER and _owner_count(membership.tenant) == 1:
        raise Conflict("A tenant keeps at least one owner.", code="last_owner")
    old = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        tenant=membership.tenant, action="member.update", obj=membership,
        object_repr=membership.user.email, data={"role": [old, role]},
    )
    return membership


@transaction.atomic
def member_remove(*, actor: Membership, membership: Membership) -> None:
    """Remove a member (or leave, when `actor` is `membership`) and revoke their API keys
    in this tenant."""
    list(Membership.objects.select_for_update().filter(tenant=membership.tenant))
    membership.refresh_from_db()
    if actor.pk != membership.pk:  # leaving a tenant needs no rank
        _check_can_manage(actor=actor, target=membership)
    if membership.role == Role.OWNER and _owner_count(membership.tenant) == 1:
        raise Conflict("A tenant keeps at least one owner.", code="last_owner")
    # Their keys in this tenant die with the membership, for good: a key only checked
    # for a membership would come back to life if they were invited again.
    keys = list(
        ApiKey.objects.select_for_update()
        .filter(tenant=membership.tenant, created_by=membership.user, revoked_at__isnull=True)
        .order_by("created_at")
    )
    now = timezone.now()
    ApiKey.objects.filter(pk__in=[k.pk for k in keys]).update(revoked_at=now)
    for key in keys:
        audit_record(tenant=membership.tenant, action="api_key.revoke", obj=key,
                     data={"reason": "member.remove"})
    audit_record(
        tenant=membership.tenant, action="member.remove", obj=membership,
        object_repr=membership.user.email,
        data={"role": membership.role, "api_keys_revoked": [k.prefix for k in keys]},
    )
    membership.delete()


# ---------------------------------------------------------------- invitations


@transaction.atomic
def invitation_create(*, actor: Membership, email: str, role: str) -> tuple[Invitation, str]:
    """Invite `email` with `role`. Returns the invitation and its token (shown once)."""
    tenant = actor.tenant
    if not permissions.can_grant_role(actor_role=actor.role, role=role):
        raise Forbidden(f"You cannot invite with the role {role}.", fields={"role": ["Above your own role."]})
    email = User.objects.normalize_email(email).lower()
    if Membership.objects.filter(tenant=tenant, user__email__iexact=email).exists():
        raise Conflict(
            f"{email} is already a member.", code="already_member",
            fields={"email": ["Already a member of this tenant."]},
        )
    token = "inv_" + secrets.token_urlsafe(_SECRET_BYTES)
    invitation = Invitation.objects.create(
        tenant=tenant, email=email, role=role, token_hash=_hash(token),
        invited_by=actor.user,
        expires_at=timezone.now() + timedelta(days=settings.INVITATION_TTL_DAYS),
    )
    audit_record(tenant=tenant, action="invitation.create", obj=invitation, object_repr=email,
                 data={"role": role})
    return invitation, token


@transaction.atomic
def invitation_revoke(*, invitation: Invitation) -> Invitation:
    if invitation.revoked_at is None and invitation.accepted_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(tenant=invitation.tenant, action="invitation.revoke", obj=invitation,
                     object_repr=invitation.email)
    return invitation


@transaction.atomic
def invitation_accept(*, token: str, user) -> Membership:
    """The signed-in `user` accepts an invitation; the invitation's email must be theirs."""
    invitation = (
        Invitation.objects.select_for_update().filter(token_hash=_hash(token)).first()
    )
    if invitation is None or not invitation.is_open():
        raise NotFoundError("This invitation does not exist, has expired or was used.",
                            code="invitation_invalid")
    if invitation.email.lower() != (user.email or "").lower():
        raise Forbidden("This invitation was sent to another email address.",
                        code="invitation_email_mismatch")
    membership, created = Membership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role}
    )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(tenant=invitation.tenant, action="invitation.accept", obj=invitation,
                 object_repr=invitation.email, data={"role": membership.role, "new": created})
    return membership


# ---------------------------------------------------------------- API keys


def _normalise_scopes(scopes: Iterable[str]) -> list[str]:
    valid = set(Scope.values)
    result = sorted(set(scopes))
    bad = [s for s in result if s not in valid]
    if bad or not result:
        raise InvalidInput(
            "Scopes must be a non-empty list of read, write, admin.",
            fields={"scopes": [f"Unknown scope {s!r}." for s in bad] or ["At least one scope."]},
        )
    return result


@transaction.atomic
def api_key_create(
    *, membership: Membership, name: str, scopes: Iterable[str],
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for `membership`'s user in its tenant. Returns (key, full secret).

    The secret is returned exactly once; only its hash is kept.
    """
    scope_list = _normalise_scopes(scopes)
    if not permissions.scopes_within_role(role=membership.role, scopes=scope_list):
        raise Forbidden(
            f"A {membership.role} cannot create keys with scopes {', '.join(scope_list)}.",
            fields={"scopes": ["Exceeds your role."]},
        )
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidInput("The expiry must be in the future.",
                           fields={"expires_at": ["Must be in the future."]})
    for _ in range(5):
        prefix = API_KEY_PREFIX + secrets.token_hex(_PREFIX_CHARS // 2)
        secret = f"{prefix}_{secrets.token_urlsafe(_SECRET_BYTES)}"
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    tenant=membership.tenant, created_by=membership.user, name=name.strip(),
                    prefix=prefix, secret_hash=_hash(secret), scopes=scope_list,
                    expires_at=expires_at,
                )
            break
        except IntegrityError:  # a prefix collision: 1 in 4 billion, try another
            continue
    else:  # pragma: no cover - five collisions in a row
        raise Conflict("Could not allocate a key; try again.")
    audit_record(tenant=membership.tenant, action="api_key.create", obj=key,
                 data={"scopes": scope_list, "expires_at": expires_at.isoformat() if expires_at else None})
    return key, secret


@transaction.atomic
def api_key_revoke(*, key: ApiKey) -> ApiKey:
    """Revoke a key. Idempotent: revoking twice keeps the first time."""
    updated = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    key.refresh_from_db()
    if updated:
        audit_record(tenant=key.tenant, action="api_key.revoke", obj=key)
    return key


def api_key_check(*, raw: str) -> ApiKey | None:
    """The active key matching `raw`, or None. Constant-time on the secret."""
    # gpc_<8 hex>_<secret>; the secret itself may contain "_".
    prefix_len = len(API_KEY_PREFIX) + _PREFIX_CHARS
    prefix = raw[:prefix_len]
    if not prefix.startswith(API_KEY_PREFIX) or raw[prefix_len : prefix_len + 1] != "_":
        return None
    key = (
        ApiKey.objects.select_related("tenant", "created_by")
        .filter(prefix=prefix)
        .first()
    )
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(raw)):
        return None
    if not key.is_active():
        return None
    return key


def api_key_touch(*, key: ApiKey, ip: str | None) -> None:
    """Record use. Written at most once a minute per key so hot keys don't hammer one row."""
    now = timezone.now()
    if key.last_used_at and now - key.last_used_at < timedelta(seconds=60) and key.last_used_ip == ip:
        return
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=now, last_used_ip=ip)
    key.last_used_at, key.last_used_ip = now, ip


# ---------------------------------------------------------------- audit retention


def audit_purge(*, now: datetime | None = None, retention_days: int | None = None) -> int:
    """Delete audit events older than the retention period. Returns how many went."""
    now = now or timezone.now()
    days = settings.AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    deleted, _ = AuditEvent.objects.filter(created_at__lt=now - timedelta(days=days)).delete()
    return deleted
