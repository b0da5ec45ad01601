"""Writes of the gateway's own: the web terminal's tickets (issue 27, finding 7).

A ticket opens one terminal, once: `terminal_ticket_issue` (the console, when it renders the
terminal page) stores its digest; `terminal_ticket_redeem` (the gateway, on the WebSocket
upgrade) deletes the row and says whose it was. Deleting is the atomic step on every database
(PostgreSQL and the demo's SQLite alike): of two upgrades with one ticket, only the one whose
DELETE removed the row goes on. A ticket is also refused when it is older than
TICKET_MAX_AGE_S, when the console session it was issued in has ended (signed out, expired,
password changed), when the user is no longer active, and when the upgrade's Origin is not the
origin of the console page that asked for it.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from gateway.models import TerminalTicket
from gpucloud.lib import secretbox

TICKET_MAX_AGE_S = 30  # the page's script opens the WebSocket at once; a reload asks for a new one


def _digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode("utf-8", "replace")).hexdigest()


def terminal_ticket_issue(*, user_id: int, workload_id: object, session_key: str, origin: str) -> str:
    """A new ticket for `user_id` to open `workload_id`'s terminal from `origin`, valid once,
    for TICKET_MAX_AGE_S, while the console session `session_key` lasts."""
    if not session_key:
        raise ValueError("a terminal ticket is issued in a console session")
    now = timezone.now()
    TerminalTicket.objects.filter(expires_at__lt=now).delete()  # the unused ones of the past
    ticket = secrets.token_urlsafe(32)
    TerminalTicket.objects.create(digest=_digest(ticket), user_id=user_id, workload_id=workload_id,
                                  session_sealed=secretbox.seal(session_key), origin=origin,
                                  expires_at=now + timedelta(seconds=TICKET_MAX_AGE_S))
    return ticket


WRONG_ORIGIN = "wrong_origin"


@dataclass(frozen=True)
class Redeemed:
    user_id: int
    session_key: str


def terminal_ticket_redeem(*, ticket: str, workload_id: str, origin: str) -> Redeemed | str | None:
    """Use `ticket` up (whatever the outcome: a ticket shown from a foreign origin is burnt too)
    and say whose it was; WRONG_ORIGIN when `origin` is not the console page's; None when it is
    unknown, already used, expired or for another instance. The session is the caller's to
    check (`access._session_user`, the rule the HTTP proxy's cookie check uses too)."""
    if not ticket or len(ticket) > 200:
        return None
    row = TerminalTicket.objects.filter(digest=_digest(ticket)).first()
    if row is None:
        return None
    deleted, _ = TerminalTicket.objects.filter(pk=row.pk).delete()
    if deleted != 1:
        return None  # another upgrade used it between our read and our delete
    if row.expires_at <= timezone.now() or str(row.workload_id) != workload_id:
        return None
    if origin.strip().lower() != row.origin.lower():
        return WRONG_ORIGIN
    try:
        return Redeemed(user_id=row.user_id, session_key=secretbox.open_sealed(row.session_sealed))
    except secretbox.SealedError:
        return None
