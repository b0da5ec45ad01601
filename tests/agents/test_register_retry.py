"""A registration whose answer is lost is repeated safely (docs/agent.md, "Registration").

The real agent registers through a TCP relay in front of the live server that forwards its
first request, waits for the whole answer (the server has committed: the token is consumed,
the host exists) and then drops the connection instead of passing it on. Deterministic: no
sleeps, no timing. The agent's repeat carries the same registration nonce and gets the same
host again; another nonce (a stolen token) is refused as before.
"""
from __future__ import annotations

import json
import logging
import socket
import stat
import threading
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from agents.host.client import ControlPlaneClient, Unauthorized
from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.sim import SimGpuBackend, SimRuntime
from agents.host.state import NONCE_FILE, STATE_FILE
from agents.models import BootstrapToken, Host
from agents.protocol import Heartbeat, ProtocolError, RegisterRequest
from agents.selectors import hash_token
from agents.services.registration import TokenRefused, host_register
from gpucloud.tenancy.models import AuditEvent
from tests.agents.test_agent_api import Clock, new_token, region, triggered  # noqa: F401 (fixtures)


class LoseFirstAnswer:
    """A relay to `upstream` that swallows the first answer (after reading all of it)."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.lost: list[bytes] = []  # the answers the client never got
        self.passed = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            if self._stop:
                conn.close()
                return
            with conn:
                request = _read_request(conn)
                with socket.create_connection(self.upstream) as up:
                    up.sendall(request)
                    answer = b""
                    while chunk := up.recv(65536):  # urllib asks for Connection: close
                        answer += chunk
                if not self.lost:
                    self.lost.append(answer)  # the server is done; the client hears nothing
                    continue
                conn.sendall(answer)
                self.passed += 1

    def close(self) -> None:
        self._stop = True
        socket.create_connection(self.sock.getsockname()).close()
        self._thread.join(10)
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def _body(answer: bytes) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head[:100]
    return json.loads(body)


def _agent(server: str, token: str, state_dir, name: str = "sim-retry") -> Agent:
    runtime = SimRuntime(clock=Clock())
    cfg = AgentConfig(server=server, bootstrap_token=token, gpu_backend="sim", runtime="sim",
                      state_dir=state_dir, hostname=name, request_timeout_s=10).validated()
    return Agent(cfg, backend=SimGpuBackend(model="H100", count=8, hostname=name, runtime=runtime),
                 runtime=runtime, resources=(224, 2 * 1024 * 1024))


@pytest.fixture
def relay(live_server):
    r = LoseFirstAnswer(live_server.url)
    yield r
    r.close()


def test_a_lost_registration_answer_is_retried_to_the_same_host_and_a_stolen_token_is_refused(
        live_server, relay, region, tmp_path, triggered, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    token = new_token(region)
    agent = _agent(relay.url, token, tmp_path / "a")
    agent.iterate()  # registers; the answer is lost after the server committed
    assert agent.state is None and not agent.last_ok
    [lost] = relay.lost
    first = _body(lost)
    host = Host.objects.get()  # the token was consumed and the host created...
    assert str(host.pk) == first["host_id"]
    assert BootstrapToken.objects.get().used_at is not None
    nonce_file = tmp_path / "a" / NONCE_FILE  # ...and the agent keeps its nonce for the retry
    nonce = nonce_file.read_text()
    assert len(nonce) >= 43 and stat.S_IMODE(nonce_file.stat().st_mode) == 0o600
    assert not (tmp_path / "a" / STATE_FILE).exists()

    agent.iterate()  # the repeat: the same nonce, the same host, then its first heartbeat
    assert agent.last_ok and agent.state is not None
    assert agent.state.host_id == str(host.pk) and Host.objects.count() == 1
    host.refresh_from_db()
    assert host.token_hash == hash_token(agent.state.host_token) != hash_token(first["host_token"])
    assert host.gpus.count() == 8 and host.last_seq == 1
    assert not nonce_file.exists()  # it has its credentials: the next registration gets a new one
    assert json.loads((tmp_path / "a" / STATE_FILE).read_text())["host_id"] == str(host.pk)
    assert relay.passed == 2  # the repeated registration and the heartbeat
    [retry] = AuditEvent.objects.filter(action="host.register_retry")
    assert retry.object_id == str(host.pk) and AuditEvent.objects.filter(action="host.register").count() == 1
    # the token in the lost answer is revoked
    with pytest.raises(Unauthorized):
        ControlPlaneClient(live_server.url).heartbeat(
            first["host_token"], Heartbeat(host_id=str(host.pk), seq=2, gpus=[], containers=None))

    # A thief with the spent token and its own nonce, or none, gets nothing.
    thief = _agent(live_server.url, token, tmp_path / "b")
    thief.iterate()
    assert thief.state is None and not thief.last_ok
    with pytest.raises(Unauthorized):
        ControlPlaneClient(live_server.url).register(RegisterRequest(
            bootstrap_token=token, hostname="sim-retry", agent_version="0", gpu_backend="sim",
            runtime="sim", cpu_count=1, memory_mib=1))
    assert Host.objects.count() == 1
    assert AuditEvent.objects.filter(action="host.register_retry").count() == 1
    # Neither the nonce nor a token is stored or logged in plain text.
    boot = BootstrapToken.objects.get()
    assert boot.nonce_hash == hash_token(nonce)
    secrets_ = (nonce, token, first["host_token"], agent.state.host_token)
    assert not any(s in caplog.text for s in secrets_)
    for e in AuditEvent.objects.all():
        assert not any(s in json.dumps(e.data) for s in secrets_)


def _req(token: str, nonce: str | None, name: str = "h-1") -> RegisterRequest:
    return RegisterRequest(bootstrap_token=token, hostname=name, agent_version="1", gpu_backend="sim",
                           runtime="sim", cpu_count=8, memory_mib=1024, registration_nonce=nonce)


@pytest.mark.django_db
def test_a_retry_needs_the_same_nonce_and_name_within_the_window(region, triggered, settings):  # noqa: F811
    settings.REGISTER_RETRY_WINDOW_S = 600
    nonce, other = "n" * 43, "o" * 43
    token = new_token(region)
    t0 = timezone.now()
    host, first = host_register(req=_req(token, nonce), now=t0)
    for req, at in (
        (_req(token, other), t0 + timedelta(seconds=1)),  # another nonce: a stolen token
        (_req(token, None), t0 + timedelta(seconds=1)),  # none
        (_req(token, nonce, name="h-2"), t0 + timedelta(seconds=1)),  # another host name
        (_req(token, nonce), t0 + timedelta(seconds=601)),  # too late
    ):
        with pytest.raises(TokenRefused):
            host_register(req=req, now=at)
    again, second = host_register(req=_req(token, nonce), now=t0 + timedelta(seconds=599))
    assert again.pk == host.pk and second != first and Host.objects.count() == 1
    host.refresh_from_db()
    assert host.token_hash == hash_token(second)
    # a host deleted meanwhile is not brought back
    Host.objects.filter(pk=host.pk).delete()
    with pytest.raises(TokenRefused):
        host_register(req=_req(token, nonce), now=t0 + timedelta(seconds=2))
    # without a nonce, a first registration works as before and nothing can repeat it
    plain = new_token(region)
    host_register(req=_req(plain, None, name="h-3"), now=t0)
    assert BootstrapToken.objects.get(host__name="h-3").nonce_hash == ""
    with pytest.raises(TokenRefused):
        host_register(req=_req(plain, None, name="h-3"), now=t0 + timedelta(seconds=1))


def test_a_short_nonce_is_a_protocol_error():
    body = _req("gpb_x", "short").to_dict()
    with pytest.raises(ProtocolError, match="registration_nonce"):
        RegisterRequest.from_dict(body)
    assert RegisterRequest.from_dict(_req("gpb_x", "n" * 32).to_dict()).registration_nonce == "n" * 32
