"""The gateway end to end: a real agent tunnel, the real OpenSSH client, real PostgreSQL.

The host runs the simulated runtime, whose tunnel connector is the built-in fake shell:
the SSH path (auth against the control plane's rules, exec with exit status, PTY, resize,
-L forwarding, session audit, sessions ended on stop) is the one a Docker host uses.
Loopback only; every wait is bounded.
"""
from __future__ import annotations

import asyncio
import subprocess
import threading

import asyncssh
import pytest

from agents.host.tunnel import AgentTunnel, SimConnector
from gateway.server import Gateway, GatewayConfig
from gpucloud.tenancy.models import AuditEvent, Membership
from gpucloud.tenancy.services import ssh_key_add
from scheduler.choices import State
from scheduler.services import workload_transition
from tests.agents.test_agent_api import make_sim_host, place, region, state, triggered  # noqa: F401
from tests.aio import run_in_own_loop
from tests.conftest import make_actor

pytestmark = pytest.mark.django_db(transaction=True)


def keypair(tmp_path, name):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path, (tmp_path / f"{name}.pub").read_text().strip()


class GatewayThread:
    def __init__(self, tmp_path, **config):
        self.loop = asyncio.new_event_loop()
        self.gw = None
        self._stop = None
        self._started = threading.Event()
        config.setdefault("http_port", 0)
        config.setdefault("relay_port", 0)
        self.config = GatewayConfig(ssh_port=0, tunnel_port=0, host_key_path=tmp_path / "gw_key", recheck_s=0.5,
                                    **config)
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()
        assert self._started.wait(10)

    def _main(self):
        async def run():
            self._stop = asyncio.Event()
            self.gw = Gateway(self.config)
            task = asyncio.ensure_future(self.gw.serve(self._stop))
            await asyncio.wait_for(self.gw.ready.wait(), 10)
            self._started.set()
            await task
        self.loop.run_until_complete(run())

    def call(self, coro, timeout=10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self):
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)


@pytest.fixture
def running(make_sim_host, alice, tmp_path):
    """alice's RUNNING instance on a sim host whose agent holds a tunnel to a gateway."""
    sim, w = running_instance(make_sim_host, alice.tenant)
    gw = GatewayThread(tmp_path)
    tunnel = tunnel_up(sim, SimConnector(sim.runtime), gw)
    yield sim, w, gw
    tunnel.stop()
    gw.stop()


def running_instance(make_sim_host, tenant, ports=None):
    """A sim host (registered) and a RUNNING instance of `tenant`'s on it."""
    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, tenant)
    if ports is not None:
        w.ports = ports
        w.save(update_fields=["ports"])
    sim.beat(2)
    assert state(w) == State.RUNNING
    return sim, w


def tunnel_up(sim, connector, *gws):
    """The sim host's agent tunnel to the first of `gws` that answers, up (bounded wait)."""
    urls = [f"ws://127.0.0.1:{g.gw.tunnel_port}/tunnel" for g in gws]
    tunnel = AgentTunnel(urls if len(urls) > 1 else urls[0], token=lambda: sim.agent.state.host_token,
                         connector=connector, backoff_base_s=0.05, backoff_cap_s=0.2)
    tunnel.start()
    host_id = str(sim.host.pk)
    ready = threading.Event()
    for _ in range(200):  # bounded: the gateway registers the tunnel right after the handshake
        if any(host_id in g.gw.tunnels for g in gws):
            break
        ready.wait(0.05)
    assert any(host_id in g.gw.tunnels for g in gws)
    return tunnel


def ssh(port, key, user, *args, **kw):
    return subprocess.run(
        ["ssh", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{user}@127.0.0.1", *args], capture_output=True, text=True, timeout=20, **kw)


def ssh_session(port, key, user) -> subprocess.Popen:
    """An interactive session (a PTY) left open: its prompt is `$ ` on stdout."""
    return subprocess.Popen(
        ["ssh", "-tt", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{user}@127.0.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_ssh_runs_the_command_and_passes_its_exit_status_and_audits_the_session(running, alice, tmp_path):
    sim, w, gw = running
    key, pub = keypair(tmp_path, "alice")
    resp = alice.client().post("/api/v1/ssh-keys", {"name": "laptop", "public_key": pub}, format="json")
    assert resp.status_code == 201
    out = ssh(gw.gw.ssh_port, key, str(w.pk), "echo hello-$((6*7)); exit 3")
    assert (out.stdout, out.returncode) == ("hello-42\n", 3), out.stderr
    # name.tenant-slug works as the user name too
    out = ssh(gw.gw.ssh_port, key, f"{w.name}.{alice.tenant.slug}", "echo hi")
    assert (out.stdout, out.returncode) == ("hi\n", 0), out.stderr
    events = list(AuditEvent.objects.filter(tenant=alice.tenant, action__startswith="session.")
                  .order_by("created_at").values_list("action", "actor_user", "object_id", "data"))
    ends = [e for e in events if e[0] == "session.end"]
    assert [e[0] for e in events].count("session.start") == 2 and len(ends) == 2
    assert all(e[1] == alice.user.pk and e[2] == str(w.pk) for e in events)
    # (ordered by time: the ids are random UUIDs, so ordering by id flaked half the time)
    assert ends[0][3]["bytes_out"] == len("hello-42\n") and ends[0][3]["kind"] == "exec", events
    assert ends[0][3]["source"].startswith("127.0.0.1:")


def test_a_key_given_at_launch_is_accepted(running, tmp_path):
    sim, w, gw = running
    key, pub = keypair(tmp_path, "launch")
    w.ssh_keys = [pub]
    w.save(update_fields=["ssh_keys"])
    out = ssh(gw.gw.ssh_port, key, str(w.pk), "echo launch")
    assert (out.stdout, out.returncode) == ("launch\n", 0), out.stderr


def test_other_tenant_viewer_revoked_member_and_stopped_instance_are_refused(running, alice, tmp_path):
    sim, w, gw = running
    charlie = make_actor("charlie@globex.test", tenant_name="Globex")
    victor = make_actor("victor@acme.test", tenant=alice.tenant, role="viewer")
    bob = make_actor("bob@acme.test", tenant=alice.tenant, role="member")
    keys = {}
    for actor, name in ((charlie, "charlie"), (victor, "victor"), (bob, "bob")):
        keys[name], pub = keypair(tmp_path, name)
        ssh_key_add(membership=actor.membership, name=name, public_key=pub)
    for name in ("charlie", "victor"):
        out = ssh(gw.gw.ssh_port, keys[name], str(w.pk), "echo in")
        assert out.returncode == 255 and "Permission denied" in out.stderr, (name, out)
    assert ssh(gw.gw.ssh_port, keys["bob"], str(w.pk), "echo in").stdout == "in\n"
    Membership.objects.filter(pk=bob.membership.pk).delete()  # removed from the tenant
    assert ssh(gw.gw.ssh_port, keys["bob"], str(w.pk), "echo in").returncode == 255
    alice_key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)
    assert workload_transition(workload=w, to=State.STOPPING, reason="user stop")
    out = ssh(gw.gw.ssh_port, alice_key, str(w.pk), "echo in")
    assert out.returncode == 255 and "Permission denied" in out.stderr


def test_an_open_session_ends_within_seconds_of_stop(running, alice, tmp_path):
    sim, w, gw = running
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)
    proc = ssh_session(gw.gw.ssh_port, key, str(w.pk))
    try:
        assert proc.stdout.read(2) == b"$ "  # the prompt: the session is open
        assert workload_transition(workload=w, to=State.STOPPING, reason="user stop")
        assert proc.wait(timeout=5) == 255
        assert b"access was withdrawn" in proc.stdout.read() + proc.stderr.read()
    finally:
        proc.kill()
        proc.wait(5)


def test_pty_resize_and_port_forwarding_through_the_ssh_protocol(running, alice, tmp_path):
    """asyncssh as the client, to change the window size mid-session (OpenSSH does it on
    SIGWINCH from a real terminal) and to open a direct-tcpip channel (what -L does)."""
    sim, w, gw = running
    key, pub = keypair(tmp_path, "alice")
    ssh_key_add(membership=alice.membership, name="a", public_key=pub)

    async def main():
        async with asyncssh.connect("127.0.0.1", gw.gw.ssh_port, username=str(w.pk), client_keys=[str(key)],
                                    known_hosts=None) as conn:
            proc = await conn.create_process(term_type="xterm", term_size=(80, 24), encoding=None)
            await proc.stdout.readexactly(2)
            proc.change_terminal_size(132, 43)
            proc.stdin.write(b"stty size\r")
            out = b""
            while b"43 132" not in out:
                out += await proc.stdout.read(100)
            proc.stdin.write(b"exit 4\r")
            assert (await proc.wait()).exit_status == 4
            reader, writer = await conn.open_connection("localhost", 8888)
            writer.write(b"through -L")
            assert await reader.readexactly(10) == b"through -L"  # the sim's echo server
            writer.close()

    run_in_own_loop(main(), 20)
