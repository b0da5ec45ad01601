"""Writes: collect what happened into notifications, deliver their e-mail and webhook, and the
person's own changes (settings, read marks).

    beat ──notifications_tick──▶ notifications_collect(now)   one transaction: cursors + rows
                                 notifications_deliver()      outside any transaction: I/O

Collecting is idempotent (each person is told of a `key` once, a unique constraint) and
delivery is at most once per channel per row: a row is claimed PENDING → SENT/FAILED with a
guarded update before the mail or the POST goes out, so two workers never both send it.
E-mail is rate-limited per person (NOTIFY_EMAIL_PER_HOUR): past it the row stays in the inbox
with its e-mail marked RATE_LIMITED. Webhooks go through the SSRF guard (gpucloud.lib.outbound,
via billing.notify.webhook_post), signed like every gpucloud webhook, with a few retries.
"""
from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.notify import DeliveryError, webhook_post
from gpucloud.lib.errors import InvalidInput
from gpucloud.lib.outbound import OutboundError, OutboundRefused, outbound_check
from gpucloud.lib.secretbox import open_sealed, seal
from gpucloud.tenancy.audit import audit_record
from gpucloud.tenancy.choices import Role
from gpucloud.tenancy.models import Tenant
from notifications import selectors, sources
from notifications.choices import (
    EMAIL,
    INBOX,
    OPERATOR_EVENTS,
    TENANT_EVENTS,
    WEBHOOK,
    Channel,
    Delivery,
    Event,
    Scope,
)
from notifications.models import Notification, NotificationCursor, NotificationSettings

logger = logging.getLogger(__name__)

WEBHOOK_MAX_ATTEMPTS = 5
_EPOCH_LOOKBACK = timedelta(minutes=10)  # a new cursor starts here: no flood of old history


def _window(name: str, cutoff: datetime) -> tuple[NotificationCursor, datetime]:
    cursor, _ = NotificationCursor.objects.get_or_create(name=name, defaults={"until": cutoff - _EPOCH_LOOKBACK})
    cursor = NotificationCursor.objects.select_for_update().get(pk=cursor.pk)
    return cursor, cursor.until


def notifications_collect(*, now: datetime | None = None) -> int:
    """Turn what happened since the last run into notifications. Returns how many were made."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NOTIFY_SETTLE_S)
    with transaction.atomic():
        log, log_since = _window("transitions", cutoff)
        alerts, alerts_since = _window("budget_alerts", cutoff)
        found: list[sources.Occurrence] = []
        if log_since < cutoff:
            found += sources.transitions(since=log_since, until=cutoff)
            found += sources.container_events(since=log_since, until=cutoff)
        if alerts_since < cutoff:
            found += sources.budget_alerts(since=alerts_since, until=cutoff)
        found += sources.notices()
        found += sources.low_balances(now=now)
        found += sources.hosts(now=now)
        made = _fan_out(found, now=now)
        for cursor in (log, alerts):
            if cursor.until < cutoff:
                cursor.until = cutoff
                cursor.save(update_fields=["until", "updated_at"])
    return made


def _fan_out(found: Iterable[sources.Occurrence], *, now: datetime) -> int:
    """Each occurrence to each person who hears of it, on the channels they chose."""
    found = list(found)
    if not found:
        return 0
    audience = selectors.tenant_audience(tenant_ids={o.tenant_id for o in found if o.tenant_id is not None})
    ops = selectors.operators() if any(o.event in OPERATOR_EVENTS for o in found) else []
    keys = {o.key for o in found}
    told = set(Notification.objects.filter(key__in=keys).values_list("user_id", "key"))
    memo: dict[tuple[int, Any], NotificationSettings] = {}
    rows = []
    for o in found:
        if o.event in OPERATOR_EVENTS:
            people = [(u, None) for u in ops]
        else:
            people = [(u, role) for u, role in audience.get(o.tenant_id, [])]
        for user, role in people:
            if (user.pk, o.key) in told:
                continue
            s = memo.get((user.pk, o.tenant_id))
            if s is None:
                s = memo[(user.pk, o.tenant_id)] = selectors.settings_for(
                    user=user, tenant=None if o.tenant_id is None else Tenant(pk=o.tenant_id))
            if not _hears(o, user=user, role=role, scope=s.scope):
                continue
            chosen = selectors.channels_for(s, o.event)
            if not chosen:
                continue
            rows.append(Notification(
                user=user, tenant_id=o.tenant_id, event=o.event, key=o.key, subject=o.subject[:300], body=o.body,
                link=o.link[:300], created_at=now, in_inbox=INBOX in chosen,
                email_status=Delivery.PENDING if EMAIL in chosen and user.email else Delivery.NONE,
                webhook_status=Delivery.PENDING if WEBHOOK in chosen and s.webhook_url else Delivery.NONE))
    Notification.objects.bulk_create(rows, ignore_conflicts=True)  # a concurrent collector: told once
    return len(rows)


def _hears(o: sources.Occurrence, *, user, role: str | None, scope: str) -> bool:
    if o.event in OPERATOR_EVENTS:
        return True
    if o.event in TENANT_EVENTS:
        return role in (Role.OWNER, Role.ADMIN)
    if role == Role.VIEWER and o.workload_owner_id != user.pk:
        return scope == Scope.ALL
    return scope == Scope.ALL or o.workload_owner_id == user.pk


def notifications_deliver(*, now: datetime | None = None, limit: int = 200) -> dict[str, int]:
    """Send the pending e-mails and webhooks. Call outside a transaction (network I/O)."""
    now = now or timezone.now()
    done = {"email": 0, "webhook": 0}
    for n in Notification.objects.filter(email_status=Delivery.PENDING).select_related("user")[:limit]:
        done["email"] += _email(n, now=now)
    for n in Notification.objects.filter(webhook_status=Delivery.PENDING).select_related("user")[:limit]:
        done["webhook"] += _webhook(n)
    return done


def _claim(n: Notification, field: str, to: str, **more: Any) -> bool:
    return bool(Notification.objects.filter(pk=n.pk, **{field: Delivery.PENDING}).update(**{field: to}, **more))


def _email(n: Notification, *, now: datetime) -> int:
    sent = Notification.objects.filter(user=n.user, email_status=Delivery.SENT,
                                       created_at__gte=now - timedelta(hours=1)).count()
    if sent >= settings.NOTIFY_EMAIL_PER_HOUR:
        _claim(n, "email_status", Delivery.RATE_LIMITED)
        return 0
    if not _claim(n, "email_status", Delivery.SENT):
        return 0  # another worker has it
    site = settings.PUBLIC_URL.rstrip("/")
    try:
        send_mail(f"[gpucloud] {n.subject}", f"{n.body}\n\n{site}{n.link}\n\nChange what you are told of: "
                  f"{site}/console/settings/notifications/\n", settings.DEFAULT_FROM_EMAIL, [n.user.email])
    except Exception as e:  # noqa: BLE001 - a mail server's failure is the row's, not the loop's
        Notification.objects.filter(pk=n.pk).update(email_status=Delivery.FAILED, last_error=str(e)[:300])
        logger.warning("notification e-mail failed id=%s user=%s", n.pk, n.user_id)
        return 0
    return 1


def _webhook(n: Notification) -> int:
    s = NotificationSettings.objects.filter(user=n.user_id, tenant=n.tenant_id).first()
    if s is None or not s.webhook_url:
        _claim(n, "webhook_status", Delivery.NONE)
        return 0
    attempts = n.webhook_attempts + 1
    payload = {"id": n.pk, "event": n.event, "subject": n.subject, "body": n.body, "link": n.link,
               "tenant": str(n.tenant_id) if n.tenant_id else None, "created_at": n.created_at.isoformat()}
    try:
        webhook_post(url=s.webhook_url, secret=open_sealed(s.webhook_secret_sealed), payload=payload,
                     headers={"X-Gpucloud-Event": f"notification.{n.event}", "X-Gpucloud-Delivery": str(n.pk)})
    except OutboundRefused as e:
        Notification.objects.filter(pk=n.pk).update(webhook_status=Delivery.REFUSED, webhook_attempts=attempts,
                                                     last_error=str(e)[:300])
        return 0
    except (DeliveryError, OutboundError) as e:
        to = Delivery.FAILED if attempts >= WEBHOOK_MAX_ATTEMPTS else Delivery.PENDING
        Notification.objects.filter(pk=n.pk).update(webhook_status=to, webhook_attempts=attempts,
                                                     last_error=str(e)[:300])
        return 0
    Notification.objects.filter(pk=n.pk).update(webhook_status=Delivery.SENT, webhook_attempts=attempts)
    return 1


def notification_settings_update(
    *, user, tenant: Tenant | None, scope: str | None = None, channels: dict[str, list[str]] | None = None,
    webhook_url: str | None = None,
) -> tuple[NotificationSettings, str | None]:
    """Change a person's choices. Returns (settings, the new webhook secret when the URL was set
    or changed: shown once). Refuses unknown events or channels and URLs the SSRF guard refuses."""
    fields: dict[str, list[str]] = {}
    events = {e.value for e in Event} if tenant is None else {e.value for e in Event} - set(OPERATOR_EVENTS)
    if scope is not None and scope not in Scope.values:
        fields["scope"] = [f"Choose one of: {', '.join(Scope.values)}."]
    for event, chosen in (channels or {}).items():
        if event not in events:
            fields.setdefault("channels", []).append(
                f"Unknown event {event!r}; choose from {', '.join(sorted(events))}.")
        elif not isinstance(chosen, list) or any(c not in Channel.values for c in chosen):
            fields.setdefault("channels", []).append(f"{event}: a list of {', '.join(Channel.values)}.")
    if webhook_url:
        try:
            outbound_check(webhook_url)
        except OutboundRefused as e:
            fields["webhook_url"] = [str(e)]
    if fields:
        raise InvalidInput("Invalid notification settings.", fields=fields)
    new_secret = None
    with transaction.atomic():
        s = selectors.settings_for(user=user, tenant=tenant)
        if scope is not None:
            s.scope = scope
        if channels:
            s.channels = {**(s.channels or {}), **{e: sorted(set(c)) for e, c in channels.items()}}
        if webhook_url is not None and webhook_url != s.webhook_url:
            s.webhook_url = webhook_url
            if webhook_url:
                new_secret = f"whsec_{secrets.token_urlsafe(24)}"
                s.webhook_secret_sealed = seal(new_secret)
            else:
                s.webhook_secret_sealed = ""
        try:
            s.save()
        except IntegrityError:  # a concurrent first save: update that row instead
            raise InvalidInput("Settings changed meanwhile; try again.") from None
        audit_record(tenant=tenant, action="notifications.settings_update", obj=s,
                     data={"scope": s.scope, "channels": s.channels, "webhook_url": bool(s.webhook_url)})
    return s, new_secret


def notifications_mark_read(*, user, tenant: Tenant | None, ids: Iterable[int] | None = None) -> int:
    """Mark the person's own notifications read (all of them in the tenant when `ids` is None)."""
    qs = Notification.objects.filter(user=user, tenant=tenant, read_at__isnull=True)
    if ids is not None:
        qs = qs.filter(pk__in=list(ids))
    return qs.update(read_at=timezone.now())
