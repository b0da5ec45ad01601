"""Who may connect to what: synchronous ORM reads and the session audit events.

Called from the gateway's event loop through `sync_to_async` (a thread pool), never on it.
"""
from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.db import close_old_connections, connections, transaction
from django.http import HttpRequest
from django.utils import timezone

from agents.selectors import host_by_token, workload_attempt
from gateway import public
from gateway.services import Redeemed, terminal_ticket_redeem
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.audit import Actor, acting_as, audit_record
from gpucloud.tenancy.models import SshKey, Tenant, openssh_fingerprint
from gpucloud.tenancy.selectors import member_may, members_who_may
from gpucloud.tenancy.services import api_key_check
from scheduler.choices import State, WorkloadKind
from scheduler.models import Workload

F = TypeVar("F", bound=Callable[..., Any])


def in_worker_thread(fn: F) -> F:
    """Each call runs on a pool thread: it closes its database connection when done, so no
    idle connection lingers per thread (the gateway's calls are few: logins, re-checks)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()
    return wrapper  # type: ignore[return-value]


@dataclass
class Grant:
    """One authorised connection: whose, to which instance, on which host."""

    workload_id: str
    tenant_id: str
    host_id: str
    container: str  # the agent's instance id of the running container (attempt id)
    user_id: int | None  # None: a key given at launch
    key_fingerprint: str
    label: str = ""
    ports: list[int] = field(default_factory=list)
    keep_prefix: list[int] = field(default_factory=list)  # ports whose app knows its URL prefix
    jupyter_token: str = field(default="", repr=False)


def _key_blob(line: str) -> tuple[str, str]:
    parts = line.split()
    return (parts[0], parts[1]) if len(parts) >= 2 else ("", "")


def find_workload(username: str) -> Workload | None:
    """`<instance id>` or `<name>.<tenant slug>` (the name may hold dots: the slug may not)."""
    try:
        return Workload.objects.filter(pk=uuid.UUID(username), kind=WorkloadKind.INSTANCE).first()
    except ValueError:
        pass
    name, _, slug = username.rpartition(".")
    if not name:
        return None
    return (Workload.objects.filter(tenant__slug=slug, name=name, kind=WorkloadKind.INSTANCE,
                                    deleted_at__isnull=True)
            .exclude(state__in=[State.STOPPED]).order_by("-created_at").first())


@in_worker_thread
def authorize(*, username: str, public_key: str) -> Grant | None:
    """The grant for `public_key` logging in as `username`, or None (refused, whatever the cause:
    an SSH client learns nothing about which instances exist)."""
    workload = find_workload(username)
    grant = None if workload is None else _grant(workload, user_id=None, key_fingerprint="")
    if workload is None or grant is None:
        return None
    blob = _key_blob(public_key)
    for key in SshKey.objects.for_tenant(workload.tenant).filter(public_key__contains=blob[1]).select_related("user"):
        if _key_blob(key.public_key) != blob:
            continue
        if member_may(user_id=key.user_id, tenant_id=workload.tenant_id, permission=perms.WORKLOADS_CONNECT):
            grant.user_id, grant.key_fingerprint = key.user_id, key.fingerprint
            return grant
    for line in workload.ssh_keys or []:
        if _key_blob(line) == blob:
            grant.key_fingerprint = openssh_fingerprint(line)
            return grant
    return None


def _grant(workload: Workload, *, user_id: int | None, key_fingerprint: str) -> Grant | None:
    """The grant for a RUNNING instance (None when it is not running, or has no container)."""
    if workload.state != State.RUNNING:
        return None
    attempt = workload_attempt(workload=workload)
    if attempt is None:
        return None
    env = {str(k): str(v) for k, v in (workload.env or {}).items()}
    ports = [int(p) for p in workload.ports or []]
    return Grant(workload_id=str(workload.pk), tenant_id=str(workload.tenant_id), host_id=str(attempt[0]),
                 container=attempt[1], user_id=user_id, key_fingerprint=key_fingerprint,
                 label=f"{workload.name}.{workload.tenant.slug}", ports=ports,
                 keep_prefix=[p for p in ports if public.keeps_prefix(env, ports, p)],
                 jupyter_token=public.jupyter_token(workload.pk, env))


def _session_user(session_key: str) -> Any:
    """The signed-in user of a console session (Django's own checks: the session exists and
    its password hash still matches), or None."""
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)
    return user if user.is_authenticated and user.is_active else None


UNAUTHENTICATED = "unauthenticated"


@in_worker_thread
def authorize_http(*, instance: str, session_key: str = "", api_key: str = "") -> Grant | str | None:
    """Who may open the instance's ports over HTTP: a console session or an API key of a member
    of its tenant holding `workloads.connect` (a key narrowed by its scopes, as in the API).
    UNAUTHENTICATED for credentials that are no good; None (404) for an instance that is not
    this actor's to reach, not running or not there at all."""
    user, key = None, None
    if api_key:
        key = api_key_check(raw=api_key)
        if key is None or not key.created_by.is_active:
            return UNAUTHENTICATED
        user = key.created_by
    elif session_key:
        user = _session_user(session_key)
        if user is None:
            return UNAUTHENTICATED
    else:
        return UNAUTHENTICATED
    return _member_grant(instance, user.pk, key_scopes=key.scopes if key is not None else None,
                         key_tenant=key.tenant_id if key is not None else None,
                         via=f"api-key:{key.prefix}" if key is not None else "console")


def _member_grant(instance: str, user_id: int, *, key_scopes: list[str] | None = None,
                  key_tenant: object = None, via: str) -> Grant | None:
    try:
        workload = (Workload.objects.select_related("tenant")
                    .filter(pk=uuid.UUID(instance), kind=WorkloadKind.INSTANCE, deleted_at__isnull=True).first())
    except ValueError:
        return None
    if workload is None or (key_tenant is not None and key_tenant != workload.tenant_id):
        return None
    if not member_may(user_id=user_id, tenant_id=workload.tenant_id, permission=perms.WORKLOADS_CONNECT,
                      scopes=key_scopes):
        return None
    return _grant(workload, user_id=user_id, key_fingerprint=via)


@in_worker_thread
def authorize_terminal(*, instance: str, ticket: str, origin: str) -> Grant | str | None:
    """The web terminal: a ticket the console issued for this user, session and instance, used
    up here (once, within seconds, from the console page's own origin: gateway/services.py),
    while the session it was issued in lasts; then the same rules as every other way in."""
    redeemed = terminal_ticket_redeem(ticket=ticket, workload_id=instance, origin=origin)
    if not isinstance(redeemed, Redeemed):
        return redeemed  # None, or services.WRONG_ORIGIN (the proxy's 403)
    user = _session_user(redeemed.session_key)  # signed out, expired or deactivated: no terminal
    if user is None or user.pk != redeemed.user_id:
        return None
    return _member_grant(instance, user.pk, via="console")


@in_worker_thread
def still_allowed(grants: list[Grant]) -> list[bool]:
    """For each grant: is its instance still RUNNING on the same container, and its member
    still one who may connect? Two queries for any number of sessions."""
    running = {
        str(pk) for pk in Workload.objects.filter(
            pk__in={g.workload_id for g in grants}, state=State.RUNNING).values_list("pk", flat=True)
    }
    # an active member who may connect (a deactivated user or a removed member is cut off)
    allowed = members_who_may(pairs={(g.tenant_id, g.user_id) for g in grants if g.user_id is not None},
                              permission=perms.WORKLOADS_CONNECT)
    out = []
    for g in grants:
        ok = g.workload_id in running
        if ok and g.user_id is not None:
            ok = (g.tenant_id, g.user_id) in allowed
        out.append(ok)
    return out


@in_worker_thread
def host_for_token(raw: str) -> str | None:
    host = host_by_token(raw=raw)
    return None if host is None else str(host.pk)


@in_worker_thread
def audit_session(*, grant: Grant, action: str, data: dict[str, object], source_ip: str | None) -> None:
    """`session.start` / `session.end` in the tenant's audit log."""
    user = get_user_model().objects.filter(pk=grant.user_id).first() if grant.user_id else None
    tenant = Tenant.objects.get(pk=grant.tenant_id)
    with acting_as(Actor(user=user, ip=source_ip)), transaction.atomic():
        audit_record(tenant=tenant, action=action, object_type="workload", object_id=grant.workload_id,
                     object_repr=grant.label,
                     data={"at": timezone.now().isoformat(), "key": grant.key_fingerprint, **data})
