"""The web terminal's ticket opens one shell, once, from the console page that asked for it.

Issue 27, finding 7: the ticket was a signed token good for 120 s, any number of times, from
any Origin, after sign-out too. Through the real gateway and agent tunnel of
tests/gateway/test_gateway_http.py `web`, a ticket taken from the console's terminal page is
refused when used a second time, without or with a foreign Origin, once its console session
has signed out, and once it has expired.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.utils import timezone
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gpucloud.tenancy.models import AuditEvent
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.gateway.test_gateway_http import CONSOLE_ORIGIN, console_terminal, web  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def opens(url: str, origin: str | None = CONSOLE_ORIGIN) -> int:
    """101 when the terminal opened (and its shell answered), else the gateway's status."""
    try:
        with ws_connect(url, origin=origin, open_timeout=10) as ws:
            assert ws.recv(timeout=10) == b"$ "  # the shell's prompt: a root shell in the container
            return 101
    except InvalidStatus as e:
        return e.response.status_code


def shells() -> int:
    return AuditEvent.objects.filter(action="session.start", data__kind="terminal").count()


def test_a_ticket_opens_one_shell_once(web, alice):  # noqa: F811
    sim, w, gw = web
    browser, url = console_terminal(alice.user, w)
    assert opens(url) == 101
    assert opens(url) == 404  # taken from the page again: used up
    assert shells() == 1


def test_a_ticket_is_refused_from_a_foreign_origin_or_none_and_is_used_up_by_the_try(web, alice):  # noqa: F811
    sim, w, gw = web
    browser, url = console_terminal(alice.user, w)
    for origin in ("http://evil.example", f"http://127.0.0.1:{gw.gw.http_port}", "null", None):
        assert opens(console_terminal(alice.user, w, browser)[1], origin=origin) == 403, origin
    assert opens(url, origin="https://evil.example") == 403
    assert opens(url) == 404  # the page's own origin now: too late, the foreign try burnt it
    assert shells() == 0


def test_signing_out_ends_the_tickets_of_that_session(web, alice):  # noqa: F811
    sim, w, gw = web
    browser, url = console_terminal(alice.user, w)
    other, elsewhere = console_terminal(alice.user, w)  # the same user signed in on another browser
    assert browser.post("/console/signout/").status_code == 302
    assert django_settings.SESSION_COOKIE_NAME not in browser.cookies or \
        not browser.cookies[django_settings.SESSION_COOKIE_NAME].value
    assert opens(url) == 404
    assert opens(elsewhere) == 101  # the other session is still signed in
    assert shells() == 1


def test_an_expired_ticket_is_refused(web, alice):  # noqa: F811
    sim, w, gw = web
    browser, url = console_terminal(alice.user, w)
    ticket = apps.get_model("gateway", "TerminalTicket")  # (no such table before the fix: fails there too)
    assert ticket.objects.filter(user=alice.user, workload=w).count() == 1
    assert ticket.objects.get().expires_at <= timezone.now() + timedelta(seconds=30)  # short-lived
    ticket.objects.update(expires_at=timezone.now() - timedelta(seconds=1))  # its time is up
    assert opens(url) == 404
    assert not ticket.objects.exists()  # and it is gone
    assert opens(console_terminal(alice.user, w, browser)[1]) == 101  # a reload gets a new one

