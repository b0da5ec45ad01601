"""Who may connect to what: synchronous ORM reads and the session audit events.

Called from the gateway's event loop through `sync_to_async` (a thread pool), never on it.
"""
from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.contrib.auth import get_user_model
from django.db import close_old_connections, connections, transaction
from django.utils import timezone

from agents.selectors import host_by_token, workload_attempt
from frontend.models import SshKey, openssh_fingerprint
from gpucloud.tenancy import permissions as perms
from gpucloud.tenancy.audit import Actor, acting_as, audit_record
from gpucloud.tenancy.models import Membership, Tenant
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
    if workload is None or workload.state != State.RUNNING:
        return None
    attempt = workload_attempt(workload=workload)
    if attempt is None:
        return None
    host_id, container = attempt
    blob = _key_blob(public_key)
    grant = Grant(workload_id=str(workload.pk), tenant_id=str(workload.tenant_id), host_id=str(host_id),
                  container=container, user_id=None, key_fingerprint="",
                  label=f"{workload.name}.{workload.tenant.slug}", ports=[int(p) for p in workload.ports or []])
    for key in SshKey.objects.for_tenant(workload.tenant).filter(public_key__contains=blob[1]).select_related("user"):
        if _key_blob(key.public_key) != blob:
            continue
        membership = Membership.objects.filter(tenant=workload.tenant, user_id=key.user_id).first()
        if membership is not None and perms.WORKLOADS_CONNECT in perms.ROLE_PERMISSIONS.get(membership.role, ()):
            grant.user_id, grant.key_fingerprint = key.user_id, key.fingerprint
            return grant
    for line in workload.ssh_keys or []:
        if _key_blob(line) == blob:
            grant.key_fingerprint = openssh_fingerprint(line)
            return grant
    return None


@in_worker_thread
def still_allowed(grants: list[Grant]) -> list[bool]:
    """For each grant: is its instance still RUNNING on the same container, and its member
    still one who may connect? Two queries for any number of sessions."""
    running = {
        str(pk) for pk in Workload.objects.filter(
            pk__in={g.workload_id for g in grants}, state=State.RUNNING).values_list("pk", flat=True)
    }
    users = {g.user_id for g in grants if g.user_id is not None}
    members = {
        (str(t), u): role
        for t, u, role in Membership.objects.filter(user_id__in=users).values_list("tenant_id", "user_id", "role")
    }
    out = []
    for g in grants:
        ok = g.workload_id in running
        if ok and g.user_id is not None:
            role = members.get((g.tenant_id, g.user_id))
            ok = role is not None and perms.WORKLOADS_CONNECT in perms.ROLE_PERMISSIONS.get(role, ())
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
