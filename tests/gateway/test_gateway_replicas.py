"""Two gateway replicas: one is killed (SIGKILL) mid-session; the agent reconnects to the other
and new sessions work within 10 s; no container is touched.

Replica A is a real `python -m gateway` process on the test database and Redis; replica B
runs in this process (tests/gateway's GatewayThread); they share the host key file, as
replicas do. The agent is given both tunnel URLs. Every wait is bounded.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection

from agents.host.tunnel import AgentTunnel, SimConnector
from gateway.routes import Routes
from gpucloud.tenancy.services import ssh_key_add
from scheduler.choices import State
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.gateway.test_gateway_ssh import GatewayThread, keypair, running_instance, ssh
from tests.gateway.test_gateway_wake import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"gateway (\S+): ssh on [\d.]+:(\d+), tunnels on [\d.]+:(\d+), http on [\d.]+:(\d+), "
                     r"relay on [\d.]+:(\d+)")


class GatewayProcess:
    """`python -m gateway` on ephemeral ports; its ports read from its start-up line."""

    def __init__(self, tmp_path: Path, replica: str, *, wait: bool = True) -> None:
        db = connection.settings_dict
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpucloud.settings",
               "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
               "REDIS_URL": django_settings.REDIS_URL, "GATEWAY_REPLICA": replica, "GATEWAY_BIND": "127.0.0.1",
               "GATEWAY_SSH_PORT": "0", "GATEWAY_TUNNEL_PORT": "0", "GATEWAY_HTTP_PORT": "0",
               "GATEWAY_RELAY_PORT": "0",
               "GATEWAY_HOST_KEY_PATH": str(tmp_path / "gw_key")}
        self.proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.proc.stderr], daemon=True).start()
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Until its start-up line (bounded); its ports from that line."""
        deadline = time.monotonic() + 30
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.proc.poll() is None, "the gateway process did not start"
            try:
                match = STARTED.search(self.lines.get(timeout=remaining))
            except queue.Empty:
                continue
            if match:
                self.ssh_port, self.tunnel_port = int(match.group(2)), int(match.group(3))
                self.http_port, self.relay_port = int(match.group(4)), int(match.group(5))
                return

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def test_killing_the_gateway_mid_session_moves_the_agent_to_the_other_replica(make_sim_host, alice, tmp_path):
    sim, w = running_instance(make_sim_host, alice.tenant)
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)
    host_id = str(sim.host.pk)
    r = redis.Redis.from_url(django_settings.REDIS_URL)
    a = GatewayProcess(tmp_path, "gw-a")
    b = GatewayThread(tmp_path, redis_url=django_settings.REDIS_URL, replica="gw-b")
    tunnel = AgentTunnel([f"ws://127.0.0.1:{a.tunnel_port}/tunnel", f"ws://127.0.0.1:{b.gw.tunnel_port}/tunnel"],
                         token=lambda: sim.agent.state.host_token, connector=SimConnector(sim.runtime),
                         backoff_base_s=0.05, backoff_cap_s=0.2)
    tunnel.start()
    try:
        wait_until(lambda: r.get(Routes.key(host_id)) == b"gw-a", "the route naming replica A")
        session = subprocess.Popen(
            ["ssh", "-tt", "-p", str(a.ssh_port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             f"{w.pk}@127.0.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert session.stdout.read(2) == b"$ "  # a session is open through replica A
            container = {c.instance_id: c.container_id for c in sim.runtime.list()}
            calls = len(sim.runtime.calls)
            a.kill()
            killed = time.monotonic()
            assert session.wait(timeout=10) == 255  # the client sees its connection go
        finally:
            session.kill()
            session.wait(5)
        deadline = killed + 10
        wait_until(lambda: host_id in b.gw.tunnels, "the agent's tunnel to replica B", deadline - time.monotonic())
        wait_until(lambda: r.get(Routes.key(host_id)) == b"gw-b", "the route naming replica B",
                   deadline - time.monotonic())
        out = ssh(b.gw.ssh_port, key, str(w.pk), "echo back-$((2+2))")
        assert (out.stdout, out.returncode) == ("back-4\n", 0), out.stderr
        assert time.monotonic() < deadline, "a new session did not work within 10 s of the kill"
        # no container was touched: the same one runs, and the runtime was asked nothing
        assert {c.instance_id: c.container_id for c in sim.runtime.list()} == container
        assert len(sim.runtime.calls) == calls and state(w) == State.RUNNING
    finally:
        tunnel.stop()
        a.kill()
        b.stop()
        r.close()

