"""The audit trail: services call `audit_record`; the request context supplies the actor.

The API base view and the console middleware set the actor for the duration of
a request; management commands and tasks run as "system". Keeping the actor in
a context variable means services need no `request` argument and still record
who did it and from which address.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import models

from gpucloud.tenancy.models import AuditEvent, Tenant


@dataclass(frozen=True)
class Actor:
    user: Any = None  # a User or None
    api_key: Any = None  # an ApiKey or None
    ip: str | None = None

    @property
    def label(self) -> str:
        if self.user is None:
            return "system"
        name = getattr(self.user, "email", "") or getattr(self.user, "username", "")
        if self.api_key is not None:
            return f"{name} via key {self.api_key.prefix}"
        return str(name)


SYSTEM = Actor()
_current: contextvars.ContextVar[Actor] = contextvars.ContextVar("gpucloud_actor", default=SYSTEM)


def current_actor() -> Actor:
    return _current.get()


@contextlib.contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    token = _current.set(actor)
    try:
        yield
    finally:
        _current.reset(token)


def set_actor(actor: Actor) -> contextvars.Token[Actor]:
    return _current.set(actor)


def reset_actor(token: contextvars.Token[Actor]) -> None:
    _current.reset(token)


def audit_record(
    *,
    tenant: Tenant | None,
    action: str,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. Call inside the same transaction as the change it records."""
    event = audit_event(tenant=tenant, action=action, obj=obj, object_type=object_type,
                        object_id=object_id, object_repr=object_repr, data=data)
    event.save(force_insert=True)
    return event


def audit_event(
    *,
    tenant: Tenant | None,
    action: str,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str = "",
    object_repr: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """An audit event as `audit_record` writes it, unsaved: for a service that records many
    changes at once with one `AuditEvent.objects.bulk_create` in the same transaction."""
    actor = current_actor()
    if obj is not None:
        object_type = object_type or obj._meta.model_name or ""
        object_id = object_id or str(obj.pk)
        object_repr = object_repr or str(obj)[:200]
    return AuditEvent(
        tenant=tenant,
        actor_user=actor.user,
        actor_api_key=actor.api_key,
        actor=actor.label[:200],
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_repr=object_repr[:200],
        data=data or {},
        source_ip=actor.ip,
    )
