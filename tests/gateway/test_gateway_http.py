"""The gateway's HTTP side end to end: published ports at /i/<id>/<port>/, WebSockets through them.

A sim host's agent holds a real tunnel to a real gateway; its simulated instance's ports 80
and 8888 are pointed (SimConnector's `forward`) at two real local servers that answer with
what they received, so each test sees exactly what reached "the container": the path, the
headers (no platform credentials; Jupyter's token on the Jupyter port), the body. Loopback
only, real PostgreSQL, every wait bounded.
"""
from __future__ import annotations

import html
import json
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings
from django.test import Client
from websockets.sync.client import connect as ws_connect
from websockets.sync.server import serve as ws_serve

from agents.host.tunnel import SimConnector
from gateway.public import jupyter_token
from gateway.services import terminal_ticket_issue
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.services import workload_transition
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.conftest import make_actor
from tests.gateway.test_gateway_ssh import GatewayThread, running_instance, tunnel_up

pytestmark = pytest.mark.django_db(transaction=True)


class _Echo(BaseHTTPRequestHandler):
    """Port 80 of the instance: answers with what it was sent, as JSON."""

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        out = json.dumps({"method": self.command, "path": self.path, "headers": headers,
                          "body": body.decode()}).encode()
        self.send_response(200)
        if self.path == "/cookies":  # an app trying to plant the console's cookies, and its own
            for cookie in ("sessionid=planted; Path=/", "csrftoken=planted; Path=/", "app=1; Path=/"):
                self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


def _ws_app(ws) -> None:
    """Port 8888 (Jupyter's): a WebSocket echo that first says what path and token it got."""
    ws.send(json.dumps({"path": ws.request.path, "authorization": ws.request.headers.get("Authorization")}))
    for message in ws:
        ws.send(message)


@pytest.fixture
def web(make_sim_host, alice, tmp_path, settings):
    """alice's RUNNING instance publishing 80 and 8888, tunnelled to a gateway with its HTTP side."""
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    wss = ws_serve(_ws_app, "127.0.0.1", 0)
    threading.Thread(target=wss.serve_forever, daemon=True).start()
    sim, w = running_instance(make_sim_host, alice.tenant, ports=[80, 8888])
    gw = GatewayThread(tmp_path)
    settings.GATEWAY_PUBLIC_HTTP_URL = f"http://127.0.0.1:{gw.gw.http_port}"
    forward = {80: http.server_address[:2], 8888: ("127.0.0.1", wss.socket.getsockname()[1])}
    tunnel = tunnel_up(sim, SimConnector(sim.runtime, forward=forward), gw)
    yield sim, w, gw
    tunnel.stop()
    gw.stop()
    http.shutdown()
    wss.shutdown()


# The origin of the console pages Django's test client renders (its Host is "testserver").
CONSOLE_ORIGIN = "http://testserver"


def console_terminal(user, workload, client=None) -> tuple[Client, str]:
    """The web terminal's WebSocket URL with its ticket, as the console's terminal page gives it
    to `user` (signed in with `client`, or a new browser)."""
    if client is None:
        client = Client()
        client.force_login(user)
    page = client.get(f"/console/instances/{workload.pk}/terminal/")
    assert page.status_code == 200, page.status_code
    found = re.search(r'data-ws-url="([^"]+)"', page.content.decode())
    assert found, "no ticket: the instance is not running"
    return client, html.unescape(found.group(1))


def fetch(url, *, key=None, cookie=None, data=None, headers=None):
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}))
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if cookie:
        req.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_port_url_serves_the_owner_by_api_key_and_session_401_without_404_to_others(web, alice):
    sim, w, gw = web
    urls = alice.client().get(f"/api/v1/instances/{w.pk}").json()["connect"]["urls"]
    base = f"http://127.0.0.1:{gw.gw.http_port}/i/{w.pk}"
    assert urls == {"80": f"{base}/80/", "8888": f"{base}/8888/"}

    status, body = fetch(urls["80"] + "hello?x=1", key=alice.key)
    seen = json.loads(body)
    assert status == 200 and seen["path"] == "/hello?x=1", body  # the prefix is taken off ...
    assert seen["headers"]["x-forwarded-prefix"] == f"/i/{w.pk}/80"  # ... and said
    assert "authorization" not in seen["headers"]  # the API key stays with the gateway

    browser = Client()
    browser.force_login(alice.user)
    session = browser.cookies[django_settings.SESSION_COOKIE_NAME].value
    cookie = f"theme=dark; {django_settings.SESSION_COOKIE_NAME}={session}"
    status, body = fetch(urls["80"] + "form", cookie=cookie, data=b"a=1&b=2")
    seen = json.loads(body)
    assert (status, seen["method"], seen["body"]) == (200, "POST", "a=1&b=2"), body
    assert seen["headers"]["cookie"] == "theme=dark"  # the app's cookies pass, the console's does not

    with urllib.request.urlopen(urllib.request.Request(urls["80"] + "cookies", headers={
            "Authorization": f"Bearer {alice.key}"}), timeout=10) as r:
        assert r.headers.get_all("Set-Cookie") == ["app=1; Path=/"]  # the console's cookies are not the app's

    assert fetch(urls["80"])[0] == 401  # no credentials
    assert fetch(urls["80"], key="gpc_00000000_nope")[0] == 401
    assert fetch(urls["80"], cookie=f"{django_settings.SESSION_COOKIE_NAME}=stale")[0] == 401
    charlie = make_actor("charlie@globex.test", tenant_name="Globex")
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")
    for key in (charlie.key, victor.key):  # another tenant; a viewer without workloads.connect
        status, body = fetch(urls["80"], key=key)
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    assert fetch(f"{base}/81/", key=alice.key)[0] == 404  # not published
    assert fetch(f"{base}/80", key=alice.key)[0] == 200  # redirected to the slash

    assert workload_transition(workload=w, to=State.STOPPING, reason="user stop")
    assert alice.client().get(f"/api/v1/instances/{w.pk}").json()["connect"]["urls"] == {}


def test_websockets_the_jupyter_port_with_its_token_and_the_terminal_with_its_ticket(web, alice):
    sim, w, gw = web
    url = f"ws://127.0.0.1:{gw.gw.http_port}/i/{w.pk}/8888/api/kernels/k1/channels"
    with ws_connect(url, additional_headers={"Authorization": f"Bearer {alice.key}"}, open_timeout=10) as ws:
        hello = json.loads(ws.recv(timeout=10))
        token = jupyter_token(w.pk, {})
        assert hello == {"path": f"/i/{w.pk}/8888/api/kernels/k1/channels", "authorization": f"token {token}"}
        ws.send("ping-through-the-tunnel")
        assert ws.recv(timeout=10) == "ping-through-the-tunnel"
        ws.send(b"\x00\x01binary")
        assert ws.recv(timeout=10) == b"\x00\x01binary"
    # the container was started with that token, and Jupyter told its base URL
    env = next(c.spec.env for iid, c in sim.runtime._containers.items() if iid.startswith(str(w.pk)))
    assert env["JUPYTER_TOKEN"] == token and env["NOTEBOOK_ARGS"] == f"--ServerApp.base_url=/i/{w.pk}/8888/"
    with pytest.raises(Exception, match="401"):
        ws_connect(url, open_timeout=10)

    # The web terminal's WebSocket: a one-time ticket the console's page gets for the user and instance.
    browser, url = console_terminal(alice.user, w)
    with ws_connect(url, origin=CONSOLE_ORIGIN, open_timeout=10) as ws:
        ws.send(json.dumps({"resize": [100, 30]}))
        ws.send(b"stty size\r")
        seen = b""
        while b"30 100" not in seen:
            seen += ws.recv(timeout=10)
        ws.send(b"exit 7\r")
        while isinstance(message := ws.recv(timeout=10), bytes):
            pass
        assert json.loads(message) == {"exit": 7}
    terminal = f"ws://127.0.0.1:{gw.gw.http_port}/terminal/{w.pk}?ticket="
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")
    viewer = Client()
    viewer.force_login(victor.user)
    other = place(sim.host, alice.tenant)  # not running: no terminal, whoever asks
    for ticket in ("forged",  # then tickets the console would not give (a viewer; a stopped instance)
                   terminal_ticket_issue(user_id=victor.user.pk, workload_id=w.pk, origin=CONSOLE_ORIGIN,
                                         session_key=viewer.cookies[django_settings.SESSION_COOKIE_NAME].value),
                   terminal_ticket_issue(user_id=alice.user.pk, workload_id=other.pk, origin=CONSOLE_ORIGIN,
                                         session_key=browser.cookies[django_settings.SESSION_COOKIE_NAME].value)):
        with pytest.raises(Exception, match="404"):
            ws_connect(terminal + ticket, origin=CONSOLE_ORIGIN, open_timeout=10)
    events = AuditEvent.objects.filter(tenant=alice.tenant, action="session.end").values_list("data", flat=True)
    assert sorted(e["kind"] for e in events) == ["terminal", "websocket"]

    # An open terminal is ended when the instance stops (the gateway's re-check), and says why.
    with ws_connect(console_terminal(alice.user, w, browser)[1], origin=CONSOLE_ORIGIN, open_timeout=10) as ws:
        assert ws.recv(timeout=10) == b"$ "
        assert workload_transition(workload=w, to=State.STOPPING, reason="user stop")
        while isinstance(message := ws.recv(timeout=5), bytes):
            pass
        assert "access was withdrawn" in json.loads(message)["closed"]
