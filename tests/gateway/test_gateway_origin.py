"""Every WebSocket entrance of the gateway refuses a page of another site (issue 27, finding 12).

The gateway's HTTP side lists its entrances in `gateway.proxy.ENTRANCES`; this test walks that
table, so a new entrance fails here until it says how it is reached. For each, a browser's
WebSocket handshake with the credential a browser would carry on its own (the console's
session cookie; the terminal's ticket from the console page) and a foreign Origin is refused
with 403 and nothing reaches the container; the same handshake from the console's or the
gateway's own site opens, and an API key (which no browser attaches by itself) is not
Origin-checked. Through the real gateway and agent tunnel of test_gateway_http's `web`.
"""
from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from gateway.proxy import ENTRANCES
from gpucloud.tenancy.models import AuditEvent
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.gateway.test_gateway_http import CONSOLE_ORIGIN, console_terminal, web  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

FOREIGN = ["http://evil.example", "https://evil.example", "null", "http://127.0.0.1.evil.example",
           "http://evil.example:8088", "file://"]


def handshake(url: str, *, origin: str | None, headers: dict[str, str]) -> int:
    try:
        with ws_connect(url, origin=origin, additional_headers=headers, open_timeout=10) as ws:
            ws.recv(timeout=10)  # what the far end says first: it was reached
            return 101
    except InvalidStatus as e:
        return e.response.status_code


def test_every_websocket_entrance_refuses_a_foreign_origin(web, alice, settings):  # noqa: F811
    sim, w, gw = web
    base = f"ws://127.0.0.1:{gw.gw.http_port}"
    own = f"http://127.0.0.1:{gw.gw.http_port}"
    browser = Client()
    browser.force_login(alice.user)
    name = django_settings.SESSION_COOKIE_NAME
    cookie = {"Cookie": f"{name}={browser.cookies[name].value}"}
    jupyter = f"{base}/i/{w.pk}/8888/api/kernels/k1/channels"

    # entrance -> (a fresh URL and the headers a browser sends on its own, the origin it opens from, the
    # status a foreign Origin gets). /healthz never upgrades: 200, no WebSocket, whatever the Origin.
    entrances = {
        "health": (lambda: (f"{base}/healthz", {}), own, 200),
        "terminal": (lambda: (console_terminal(alice.user, w, browser)[1], {}), CONSOLE_ORIGIN, 403),
        "port": (lambda: (jupyter, cookie), own, 403),
    }
    assert set(ENTRANCES.values()) == set(entrances), "a new entrance: say here how a browser reaches it"

    before = AuditEvent.objects.filter(action="session.start").count()
    for name, (reach, _, refused) in entrances.items():
        for origin in FOREIGN:
            url, headers = reach()
            assert handshake(url, origin=origin, headers=headers) == refused, (name, origin)
    assert AuditEvent.objects.filter(action="session.start").count() == before  # nothing was opened

    # from its own site each opens (the refusal above is the Origin's, not the credential's)
    for name in ("terminal", "port"):
        reach, origin, _ = entrances[name]
        url, headers = reach()
        assert handshake(url, origin=origin, headers=headers) == 101, name
    # a port URL from the console's site on another host name the operator trusts
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example"]
    assert handshake(jupyter, origin="https://console.example", headers=cookie) == 101
    # no Origin is no browser: nobody's cookie is borrowed; an API key is the caller's own
    assert handshake(jupyter, origin=None, headers=cookie) == 101
    assert handshake(jupyter, origin="http://evil.example", headers={"Authorization": f"Bearer {alice.key}"}) == 101
