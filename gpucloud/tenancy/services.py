"""Writes for tenancy: sign-up (and its email confirmation), members, invitations, API keys,
members' SSH keys, suspension, two-factor devices.

Every service that changes something records an audit event in the same transaction.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core import signing
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.text import slugify
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpucloud.lib.db import model_columns, model_from_row
from gpucloud.lib.errors import Conflict, Forbidden, InvalidInput, NotFoundError
from gpucloud.tenancy import hooks, permissions
from gpucloud.tenancy.audit import Actor, acting_as, audit_record, current_actor
from gpucloud.tenancy.choices import Role, Scope, TenantStatus
from gpucloud.tenancy.models import (
    SSH_PUBLIC_KEY,
    SSH_PUBLIC_KEY_INVALID,
    ApiKey,
    AuditEvent,
    EmailVerification,
    Invitation,
    Membership,
    SshKey,
    Tenant,
)

User = get_user_model()
logger = logging.getLogger(__name__)

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
def tenant_create(*, name: str, owner, plan: str | None = None, signup_credit: bool = True) -> Tenant:
    """A tenant owned by `owner`. With `signup_credit=False` (self-service sign-up) its account
    opens at zero, so nothing paid launches until `email_verify` grants the credit."""
    name = name.strip()
    if not name:
        raise InvalidInput("A tenant needs a name.", fields={"tenant_name": ["This field may not be blank."]})
    tenant = Tenant.objects.create(
        name=name, slug=_unique_slug(name), plan=plan or settings.DEFAULT_PLAN
    )
    Membership.objects.create(tenant=tenant, user=owner, role=Role.OWNER)
    audit_record(tenant=tenant, action="tenant.create", obj=tenant)
    hooks.tenant_created(tenant, signup_credit=signup_credit)  # billing opens its account (gpucloud/tenancy/hooks.py)
    return tenant


SIGNUP_CLOSED = "Sign-up is closed on this installation: ask an operator for an account."


@transaction.atomic
def user_signup(*, email: str, password: str, tenant_name: str, full_name: str = ""):
    """Create a user and a tenant that the user owns. Returns (user, tenant).

    The tenant's sign-up credit waits until the user confirms their email address
    (`email_verification_send`, then `email_verify`); until then its balance is zero.
    """
    if not settings.OPEN_SIGNUP:
        raise Forbidden(SIGNUP_CLOSED, code="signup_closed")
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
        tenant = tenant_create(name=tenant_name, owner=user, signup_credit=False)
    EmailVerification.objects.create(user=user, email=email, tenant=tenant)
    return user, tenant


# ---------------------------------------------------------------- email confirmation

_VERIFY_SALT = "gpucloud.tenancy.email-verification"
VERIFY_INVALID = "This confirmation link is not valid (it may be incomplete): sign in and send a new one."
VERIFY_EXPIRED = "This confirmation link has expired: sign in and send a new one."


def email_verification_token(*, user) -> str:
    """A signed, timestamped token naming the user and the address it confirms (no row: the
    signature is the proof, SECRET_KEY the key, EMAIL_VERIFICATION_TTL_HOURS the life)."""
    return signing.dumps({"u": user.pk, "e": user.email.lower()}, salt=_VERIFY_SALT, compress=True)


def email_verification_send(*, user, verify_url: str) -> bool:
    """Mail the confirmation link (`verify_url?token=…`) through Django's mail backend.

    Call after the sign-up committed (mail is network I/O). The demo's console backend
    prints the mail, link included, on the web process's output. A mail server that fails
    does not undo the sign-up: False, logged, and the console offers to send it again.
    """
    link = f"{verify_url}?token={email_verification_token(user=user)}"
    try:
        _send_verification(user=user, link=link)
    except Exception:
        logger.exception("could not mail the confirmation link to user %s", user.pk)
        return False
    return True


def _send_verification(*, user, link: str) -> None:
    send_mail(
        "Confirm your email address for gpucloud",
        "Welcome to gpucloud.\n\n"
        f"Open this link to confirm {user.email} and receive your sign-up credit:\n\n{link}\n\n"
        f"The link is valid for {settings.EMAIL_VERIFICATION_TTL_HOURS} hours. If you did not sign up, "
        "ignore this mail.\n",
        None, [user.email],
    )


def email_verify(*, token: str) -> tuple[EmailVerification, bool]:
    """Confirm the address a token names and grant the sign-up credit, exactly once.

    Returns (verification, newly): `newly` is False when it was confirmed before (a second
    click grants nothing). The row is locked, so two clicks at once grant once.
    """
    fields = {"token": [VERIFY_INVALID]}
    try:
        data = signing.loads(token, salt=_VERIFY_SALT, max_age=settings.EMAIL_VERIFICATION_TTL_HOURS * 3600)
    except signing.SignatureExpired:
        raise InvalidInput(VERIFY_EXPIRED, code="verification_invalid", fields={"token": [VERIFY_EXPIRED]}) from None
    except signing.BadSignature:
        raise InvalidInput(VERIFY_INVALID, code="verification_invalid", fields=fields) from None
    with transaction.atomic():
        row = (EmailVerification.objects.select_for_update(of=("self",)).select_related("user", "tenant")
               .filter(user_id=data.get("u"), email=data.get("e")).first())
        if row is None:
            raise InvalidInput(VERIFY_INVALID, code="verification_invalid", fields=fields)
        if row.verified_at is not None:
            return row, False
        row.verified_at = timezone.now()
        row.save(update_fields=["verified_at"])
        credit = None
        if row.tenant is not None:
            credit = hooks.email_verified(row.tenant)  # billing grants the sign-up credit
        with acting_as(Actor(user=row.user, ip=current_actor().ip)):
            audit_record(tenant=row.tenant, action="user.verify_email", obj=row.user, object_repr=row.email,
                         data={"signup_credit": str(credit.amount) if credit else "0"})
    return row, True


# ---------------------------------------------------------------- two-factor (TOTP)

OTP_CODE_WRONG = "That code is not right: use the current 6-digit code from your authenticator app."
OTP_CODE_MISSING = "Enter the 6-digit code from your authenticator app."
OTP_WAIT = "Too many wrong codes: wait a minute, then try again."


def totp_check(*, device: TOTPDevice, token: str) -> str | None:
    """Check a code against a device. None when right, else the sentence to show.

    django-otp's throttling applies (each wrong code doubles the wait before the next is
    even checked) and a code is accepted once (no replay). Not inside a transaction that a
    refusal rolls back: the failure count must stick.
    """
    token = token.strip().replace(" ", "")
    if not token:
        return OTP_CODE_MISSING
    allowed, _ = device.verify_is_allowed()
    if not allowed:
        return OTP_WAIT
    return None if device.verify_token(token) else OTP_CODE_WRONG


def totp_device_start(*, user) -> TOTPDevice:
    """A fresh secret, not yet in force: it is confirmed with a code from the app."""
    TOTPDevice.objects.filter(user=user, confirmed=False).delete()
    return TOTPDevice.objects.create(user=user, name="authenticator app", confirmed=False)


def totp_device_confirm(*, user, device: TOTPDevice, token: str) -> TOTPDevice:
    """Turn two-factor on with the device the user's app now shows codes for."""
    error = totp_check(device=device, token=token)
    if error:
        raise InvalidInput(error, code="otp_invalid", fields={"code": [error]})
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).exclude(pk=device.pk).delete()  # one device a user
        device.confirmed = True
        device.save(update_fields=["confirmed"])
        audit_record(tenant=None, action="user.2fa_enable", obj=user, object_repr=user.email)
    return device


def totp_device_remove(*, user, device: TOTPDevice, token: str) -> None:
    """Turn two-factor off; it takes a current code, so a stolen session alone cannot."""
    error = totp_check(device=device, token=token)
    if error:
        raise InvalidInput(error, code="otp_invalid", fields={"code": [error]})
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).delete()
        audit_record(tenant=None, action="user.2fa_disable", obj=user, object_repr=user.email)


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


def _acting_key_scopes() -> list[str] | None:
    """The scopes of the API key the current request acts through, None for a console session,
    a command or a task. The API's base view puts the key on the audit actor for every request
    (gpucloud/api/views.py), so a new API route that grants is held to its key without a word."""
    key = current_actor().api_key
    return None if key is None else list(key.scopes)


def _check_grant(*, actor: Membership, field: str, role: str | None = None, scopes: list[str] | None = None) -> None:
    """Refuse (403) a grant of `role` or key `scopes` beyond what `actor` holds: their role and,
    acting through an API key, its scopes (permissions.grant_within, the rule for every grant)."""
    held = _acting_key_scopes()
    if permissions.grant_within(role=actor.role, scopes=held, grant_role=role, grant_scopes=scopes or ()):
        return
    what = f"the role {role}" if role is not None else f"keys with scopes {', '.join(scopes or ())}"
    if held is not None and permissions.grant_within(role=actor.role, scopes=None, grant_role=role,
                                                     grant_scopes=scopes or ()):
        raise Forbidden(f"This API key's scopes ({', '.join(held)}) cannot grant {what}.",
                        code="insufficient_scope", fields={field: ["Exceeds this API key's scopes."]})
    if role is not None:
        raise Forbidden(f"You cannot grant the role {role}.", fields={field: ["Above your own role."]})
    raise Forbidden(f"A {actor.role} cannot create {what}.", fields={field: ["Exceeds your role."]})


def _check_can_manage(*, actor: Membership, target: Membership) -> None:
    if not permissions.can_grant_role(actor_role=actor.role, role=target.role):
        raise Forbidden(f"Only an owner can change or remove an {target.role}.")


@transaction.atomic
def member_update_role(*, actor: Membership, membership: Membership, role: str) -> Membership:
    # Lock the tenant's memberships so two demotions cannot leave it without an owner.
    list(Membership.objects.select_for_update().filter(tenant=membership.tenant))
    membership.refresh_from_db()
    _check_can_manage(actor=actor, target=membership)
    _check_grant(actor=actor, role=role, field="role")
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
    """Remove a member (or leave, when `actor` is `membership`), revoke their API keys and
    delete their saved SSH keys in this tenant."""
    list(Membership.objects.select_for_update().filter(tenant=membership.tenant))
    membership.refresh_from_db()
    if actor.pk != membership.pk:  # leaving a tenant needs no rank
        _check_can_manage(actor=actor, target=membership)
    if membership.role == Role.OWNER and _owner_count(membership.tenant) == 1:
        raise Conflict("A tenant keeps at least one owner.", code="last_owner")
    _membership_end(membership)


@transaction.atomic
def member_remove_by_operator(*, membership: Membership) -> None:
    """An operator removes a member in /admin/ (no rank to check: operators stand above
    tenants); the member's keys go as with `member_remove`."""
    list(Membership.objects.select_for_update().filter(tenant=membership.tenant))
    _membership_end(membership)


def _membership_end(membership: Membership) -> None:
    """Delete the membership and what it holds in the tenant, in the caller's transaction.

    Their keys in this tenant die with the membership, for good: a key only checked for a
    membership would come back to life if they were invited again. Their saved SSH keys
    too: the gateway lets a saved key in for whoever is a member.
    """
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
    ssh_keys = list(SshKey.objects.select_for_update().for_tenant(membership.tenant)
                    .filter(user=membership.user).order_by("pk"))
    for ssh_key in ssh_keys:
        audit_record(tenant=membership.tenant, action="ssh_key.delete", obj=ssh_key, object_repr=ssh_key.name,
                     data={"reason": "member.remove", "fingerprint": ssh_key.fingerprint})
    SshKey.objects.filter(pk__in=[k.pk for k in ssh_keys]).delete()
    audit_record(
        tenant=membership.tenant, action="member.remove", obj=membership,
        object_repr=membership.user.email,
        data={"role": membership.role, "api_keys_revoked": [k.prefix for k in keys],
              "ssh_keys_removed": [k.fingerprint for k in ssh_keys]},
    )
    membership.delete()


# ---------------------------------------------------------------- invitations


@transaction.atomic
def invitation_create(*, actor: Membership, email: str, role: str) -> tuple[Invitation, str]:
    """Invite `email` with `role`. Returns the invitation and its token (shown once)."""
    tenant = actor.tenant
    if not permissions.can_grant_role(actor_role=actor.role, role=role):
        raise Forbidden(f"You cannot invite with the role {role}.", fields={"role": ["Above your own role."]})
    _check_grant(actor=actor, role=role, field="role")
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
    # The role is granted now, so it is the inviter's standing now that bounds it: an invitation
    # outlives neither its sender's membership nor their rank (a demoted admin's invitations
    # to admin are spent).
    inviter = Membership.objects.filter(tenant=invitation.tenant, user_id=invitation.invited_by_id).first()
    if inviter is None or not permissions.can_grant_role(actor_role=inviter.role, role=invitation.role):
        raise Forbidden(f"Whoever sent this invitation can no longer grant the role {invitation.role}: "
                        "ask for a new invitation.", code="invitation_invalid")
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

    The key's scopes stay within what the creator holds: their role, and the scopes of the key
    they act through (a `write` key mints no `admin` key). The secret is returned exactly
    once; only its hash is kept.
    """
    scope_list = _normalise_scopes(scopes)
    _check_grant(actor=membership, scopes=scope_list, field="scopes")
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
    key = _api_key_by_prefix(prefix)
    if key is None or not hmac.compare_digest(key.secret_hash, _hash(raw)):
        return None
    if not key.is_active():
        return None
    return key


def _api_key_by_prefix(prefix: str) -> ApiKey | None:
    """The key with `prefix`, its tenant and creator, and the creator's membership of that
    tenant (`key.membership`, None when there is none): one query in written SQL, as on every
    API request building the ORM's queries cost more CPU than running them."""
    with connection.cursor() as cur:
        cur.execute(_api_key_sql(), [prefix])
        row = cur.fetchone()
    if row is None:
        return None
    key, at = model_from_row(ApiKey, row)
    key.tenant, at = model_from_row(Tenant, row, at)
    key.created_by, at = model_from_row(get_user_model(), row, at)
    membership = None
    if row[at] is not None:  # the LEFT JOIN found the membership
        membership, _ = model_from_row(Membership, row, at)
        membership.tenant, membership.user = key.tenant, key.created_by
    key.membership = membership
    return key


@functools.cache
def _api_key_sql() -> str:
    user = get_user_model()
    k, t, u, m = (x._meta.db_table for x in (ApiKey, Tenant, user, Membership))
    return (f'SELECT {model_columns(ApiKey, "k")}, {model_columns(Tenant, "t")}, {model_columns(user, "u")}, '
            f'{model_columns(Membership, "m")} FROM "{k}" k JOIN "{t}" t ON t."id" = k."tenant_id" '
            f'JOIN "{u}" u ON u."id" = k."created_by_id" '
            f'LEFT JOIN "{m}" m ON m."tenant_id" = k."tenant_id" AND m."user_id" = k."created_by_id" '
            f'WHERE k."prefix" = %s')


def api_key_touch(*, key: ApiKey, ip: str | None) -> None:
    """Record use. Written at most once a minute per key so hot keys don't hammer one row."""
    now = timezone.now()
    if key.last_used_at and now - key.last_used_at < timedelta(seconds=60) and key.last_used_ip == ip:
        return
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=now, last_used_ip=ip)
    key.last_used_at, key.last_used_ip = now, ip


# ---------------------------------------------------------------- SSH keys


@transaction.atomic
def ssh_key_add(*, membership: Membership, name: str, public_key: str) -> SshKey:
    """Save a public key for `membership`'s user in its tenant; it must be one the launch API
    would accept (the same SSH_PUBLIC_KEY), so a saved key is never refused at launch."""
    key = public_key.strip()
    if not SSH_PUBLIC_KEY.match(key):
        raise InvalidInput(SSH_PUBLIC_KEY_INVALID, fields={"public_key": [SSH_PUBLIC_KEY_INVALID]})
    name = name.strip()
    if SshKey.objects.filter(tenant=membership.tenant, user=membership.user, name=name).exists():
        raise Conflict(f"You already have a key named {name!r}.", fields={"name": ["Already in use."]})
    row = SshKey.objects.create(tenant=membership.tenant, user=membership.user, name=name, public_key=key)
    audit_record(tenant=membership.tenant, action="ssh_key.create", obj=row, object_repr=name)
    return row


@transaction.atomic
def ssh_key_remove(*, key: SshKey) -> None:
    audit_record(tenant=key.tenant, action="ssh_key.delete", obj=key, object_repr=key.name)
    key.delete()


# ---------------------------------------------------------------- audit retention


def audit_purge(*, now: datetime | None = None, retention_days: int | None = None) -> int:
    """Delete audit events older than the retention period. Returns how many went."""
    now = now or timezone.now()
    days = settings.AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    deleted, _ = AuditEvent.objects.filter(created_at__lt=now - timedelta(days=days)).delete()
    return deleted
