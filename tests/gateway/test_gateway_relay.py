"""Relaying between gateway replicas (gateway/relay.py): the agent's tunnel is on replica A
only; users reach replica B, which carries their sessions to A over the internal relay port.

Both replicas are real `python -m gateway` processes on the test database and Redis (sharing
the host key file and, through SECRET_KEY, the relay secret); the agent's tunnel runs in this
process with the simulated runtime (its fake shell; port 80 pointed at a real local HTTP
server). The real OpenSSH client. Every wait is bounded.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import socket
import threading
from http.server import ThreadingHTTPServer

import asyncssh
import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from websockets.sync.client import connect as ws_connect

from agents.host import mux as m
from agents.host.tunnel import AgentTunnel, SimConnector
from gateway import relay
from gateway.routes import Routes
from gateway.server import load_host_key
from gpucloud.tenancy.models import AuditEvent
from gpucloud.tenancy.services import ssh_key_add
from scheduler.choices import State
from scheduler.services import workload_transition
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.aio import run_in_own_loop
from tests.gateway.test_gateway_http import CONSOLE_ORIGIN, _Echo, console_terminal, fetch
from tests.gateway.test_gateway_replicas import GatewayProcess
from tests.gateway.test_gateway_ssh import GatewayThread, keypair, running_instance, ssh, tunnel_up
from tests.gateway.test_gateway_wake import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_replicas(make_sim_host, alice, tmp_path):
    """alice's RUNNING instance (port 80 published) whose host's tunnel is on replica A only."""
    http = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    sim, w = running_instance(make_sim_host, alice.tenant, ports=[80])
    load_host_key(tmp_path / "gw_key")  # created once, before two processes race to
    a = GatewayProcess(tmp_path, "gw-a", wait=False)
    b = GatewayProcess(tmp_path, "gw-b", wait=False)
    r = redis.Redis.from_url(django_settings.REDIS_URL)
    tunnel = None
    try:
        a.wait_started()
        b.wait_started()
        tunnel = AgentTunnel(f"ws://127.0.0.1:{a.tunnel_port}/tunnel", token=lambda: sim.agent.state.host_token,
                             connector=SimConnector(sim.runtime, forward={80: http.server_address[:2]}),
                             backoff_base_s=0.05, backoff_cap_s=0.2)
        tunnel.start()
        wait_until(lambda: r.get(Routes.key(str(sim.host.pk))) == b"gw-a", "the route naming replica A")
        wait_until(lambda: r.get(Routes.replica_key("gw-a")) == f"127.0.0.1:{a.relay_port}".encode(),
                   "replica A's relay address")
        yield sim, w, a, b
    finally:
        if tunnel is not None:
            tunnel.stop()
        a.kill()
        b.kill()
        r.close()
        http.shutdown()


def test_ssh_http_pty_and_forwarding_through_the_replica_without_the_tunnel_and_strangers_refused(
        two_replicas, alice, tmp_path):
    """(One test: two gateway processes start once.)"""
    sim, w, a, b = two_replicas
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)

    # OpenSSH through B: the command's output and its exit status
    out = ssh(b.ssh_port, key, str(w.pk), "echo hi; exit 3")
    assert (out.stdout, out.returncode) == ("hi\n", 3), out.stderr
    # audited by B, where the user is
    ends = list(AuditEvent.objects.filter(tenant=alice.tenant, action="session.end").values_list("data", flat=True))
    assert len(ends) == 1 and ends[0]["session"].startswith("gw-b/") and ends[0]["bytes_out"] == 3, ends

    # the HTTP proxy of B reaches the instance's port 80
    status, body = fetch(f"http://127.0.0.1:{b.http_port}/i/{w.pk}/80/hello?x=1", key=alice.key)
    assert status == 200 and json.loads(body)["path"] == "/hello?x=1", body
    assert fetch(f"http://127.0.0.1:{b.http_port}/i/{w.pk}/80/")[0] == 401  # B still checks credentials

    # the web terminal through B: a PTY, its size, the exit status
    ticket = console_terminal(alice.user, w)[1].partition("?ticket=")[2]
    with ws_connect(f"ws://127.0.0.1:{b.http_port}/terminal/{w.pk}?ticket={ticket}", origin=CONSOLE_ORIGIN,
                    open_timeout=10) as ws:
        ws.send(json.dumps({"resize": [100, 30]}))
        ws.send(b"stty size\r")
        seen = b""
        while b"30 100" not in seen:
            seen += ws.recv(timeout=10)
        ws.send(b"exit 7\r")
        while isinstance(message := ws.recv(timeout=10), bytes):
            pass
        assert json.loads(message) == {"exit": 7}

    async def pty_and_forward() -> None:
        async with asyncssh.connect("127.0.0.1", b.ssh_port, username=str(w.pk), client_keys=[str(key)],
                                    known_hosts=None) as conn:
            proc = await conn.create_process(term_type="xterm", term_size=(80, 24), encoding=None)
            await proc.stdout.readexactly(2)
            proc.change_terminal_size(132, 43)  # relayed in order with the keystrokes after it
            proc.stdin.write(b"stty size\r")
            seen = b""
            while b"43 132" not in seen:
                seen += await proc.stdout.read(100)
            proc.stdin.write(b"exit 4\r")
            assert (await proc.wait()).exit_status == 4
            reader, writer = await conn.open_connection("localhost", 8888)  # -L: the sim's echo
            writer.write(b"x" * 300_000)  # more than one credit window, on both hops
            assert await reader.readexactly(300_000) == b"x" * 300_000
            writer.close()

    run_in_own_loop(pty_and_forward(), 20)

    # A's relay port, to peers without the secret: a wrong proof: the connection is closed, nothing after the challenge
    with socket.create_connection(("127.0.0.1", a.relay_port), timeout=5) as s:
        challenge = _read(s, len(relay.MAGIC) + relay.NONCE)
        assert challenge.startswith(relay.MAGIC)
        nonce_b = os.urandom(relay.NONCE)
        wrong = hmac.new(b"not the secret", relay.MAGIC + b"client" + challenge[len(relay.MAGIC):] + nonce_b,
                         hashlib.sha256).digest()
        s.sendall(relay.MAGIC + nonce_b + wrong)
        assert s.recv(100) == b""
    # no handshake at all, straight to an OPEN for the host's container: closed, nothing opened
    open_frame = m.encode_json(1, m.OPEN_EXEC, {"host": str(sim.host.pk), "instance": "x", "command": "echo pwned"})
    with socket.create_connection(("127.0.0.1", a.relay_port), timeout=5) as s:
        _read(s, len(relay.MAGIC) + relay.NONCE)
        s.sendall((relay.LENGTH.pack(len(open_frame)) + open_frame) * 3)
        assert s.recv(100) == b""

    async def with_secret(secret: bytes, params: dict) -> str:
        try:
            stream = await relay.open_remote(f"127.0.0.1:{a.relay_port}", secret, m.OPEN_EXEC,
                                             {"command": "echo in", "tty": False, **params})
        except m.OpenFailed as e:
            return str(e)
        await stream.close()
        return "opened"

    # the client side refuses as well: a wrong secret never gets a stream
    assert "refused the relay" in run_in_own_loop(with_secret(b"wrong", {"host": str(sim.host.pk)}), 10)
    # with the secret, A serves only hosts whose tunnel it holds
    secret = relay.derive_secret(django_settings.GATEWAY_RELAY_SECRET, django_settings.SECRET_KEY)
    refused = run_in_own_loop(with_secret(secret, {"host": "00000000-0000-0000-0000-000000000000",
                                                   "instance": "x"}), 10)
    assert "not connected to this gateway replica" in refused


def test_a_relayed_session_ends_on_stop_and_releases_the_tunnel_stream(make_sim_host, alice, tmp_path):
    """In-process replicas (their state visible): B's re-check ends a relayed session; A's
    stream on the tunnel goes with it."""
    sim, w = running_instance(make_sim_host, alice.tenant)
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)
    a = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL, replica="gw-ra")
    b = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL, replica="gw-rb")
    tunnel = tunnel_up(sim, SimConnector(sim.runtime), a)
    host_id = str(sim.host.pk)
    try:
        wait_until(lambda: a.call(a.gw.routes.lookup(host_id)) == "gw-ra", "the route naming replica A")

        def stop() -> None:
            try:
                workload_transition(workload=w, to=State.STOPPING, reason="user stop")
            finally:
                connection.close()  # this thread's own

        async def open_shell_until_stopped() -> int:
            async with asyncssh.connect("127.0.0.1", b.gw.ssh_port, username=str(w.pk), client_keys=[str(key)],
                                        known_hosts=None) as conn:
                proc = await conn.create_process(term_type="xterm", encoding=None)
                await proc.stdout.readexactly(2)  # the prompt: open, through A
                assert len(a.gw.tunnels[host_id].streams) == 1 and a.gw.relay.relayed == 1
                await asyncio.get_running_loop().run_in_executor(None, stop)
                return (await asyncio.wait_for(proc.wait(), 10)).exit_status

        assert run_in_own_loop(open_shell_until_stopped(), 20) == 255
        wait_until(lambda: not a.gw.tunnels[host_id].streams, "A's tunnel stream closed", 5)
        # (B forgets the session on its own loop once the channel closed: the client may see
        # the exit status first)
        wait_until(lambda: not b.gw.sessions, "B's session forgotten", 5)
        assert b.gw.relayed_out == 1
        wait_until(lambda: AuditEvent.objects.filter(tenant=alice.tenant, action="session.end").exists(),
                   "the session's end audited by B", 5)
    finally:
        tunnel.stop()
        a.stop()
        b.stop()


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "closed early"
        out += chunk
    return out


def test_a_tenants_session_limit_counts_its_sessions_on_every_replica(make_sim_host, alice, tmp_path):
    """The per-tenant limit is one count across the replicas sharing Redis: with a limit of 1,
    a shell open through A refuses a second one through B, until the first has ended."""
    sim, w = running_instance(make_sim_host, alice.tenant)
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)
    a = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL, replica="gw-la", session_limit=1)
    b = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL, replica="gw-lb", session_limit=1)
    tunnel = tunnel_up(sim, SimConnector(sim.runtime), a)
    host_id = str(sim.host.pk)

    async def run(port: int, command: str):
        async with asyncssh.connect("127.0.0.1", port, username=str(w.pk), client_keys=[str(key)],
                                    known_hosts=None) as conn:
            return await conn.run(command)

    async def one_open_on_a_then_b() -> tuple[asyncssh.SSHCompletedProcess, asyncssh.SSHCompletedProcess]:
        async with asyncssh.connect("127.0.0.1", a.gw.ssh_port, username=str(w.pk), client_keys=[str(key)],
                                    known_hosts=None) as conn:
            proc = await conn.create_process(term_type="xterm", encoding=None)
            await proc.stdout.readexactly(2)  # the prompt: A's session is open
            refused = await run(b.gw.ssh_port, "echo second")
            proc.stdin.write(b"exit 0\n")
            await asyncio.wait_for(proc.wait(), 10)
        wait_until(lambda: not a.gw.sessions, "A's session finished", 5)
        return refused, await run(b.gw.ssh_port, "echo second")

    try:
        wait_until(lambda: a.call(a.gw.routes.lookup(host_id)) == "gw-la", "the route naming replica A")
        refused, admitted = run_in_own_loop(one_open_on_a_then_b(), 30)
        assert refused.exit_status != 0 and "limit of open sessions" in refused.stderr, refused
        assert admitted.exit_status == 0 and "second" in admitted.stdout, admitted
        # nothing left counted once every session has ended
        wait_until(lambda: not b.gw.sessions, "B's session finished", 5)
        r = redis.Redis.from_url(django_settings.REDIS_URL)
        assert r.zcard(Routes.sessions_key(str(alice.tenant.pk))) == 0
        r.close()
    finally:
        tunnel.stop()
        a.stop()
        b.stop()
