"""Acceptance of issue 13 on real parts: the API, the real scheduler, a real agent with the
Docker runtime, the gateway, Debian's OpenSSH client, a busybox container.

A tenant saves an SSH key through the API and launches an instance of a locally built
busybox image (Debian's busybox-static, as tests/agents/test_docker_runtime.py builds it,
with `stty` added); the agent, started as `python -m agents.host` starts it
(`start_tunnel`), dials the gateway. Then `ssh … 'cmd'` passes output and exit status, a
PTY session sees a window change, `-L` reaches busybox httpd in the container, and sftp
says plainly that the image has no sftp-server.

Everything the agent creates carries `gpucloud.agent=<this run>` (`--docker-scope`), so no
other test's container on the shared engine is touched; all of it is removed at the end.
Every wait is bounded.
"""
from __future__ import annotations

import hashlib
import io
import secrets
import socket
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from decimal import Decimal

import asyncssh
import docker
import pytest
from websockets.sync.client import connect as ws_connect

from agents.host.__main__ import build, start_tunnel
from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.docker import LABEL_AGENT
from agents.host.runtime import LABEL_TENANT
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.catalogue.services import price_set
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload
from tests.agents.test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from tests.agents.test_docker_runtime import BUSYBOX
from tests.aio import run_in_own_loop
from tests.conftest import make_actor
from tests.gateway.test_gateway_ssh import GatewayThread, keypair, ssh

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = f"gw-{secrets.token_hex(4)}"
APPLETS = ["sh", "sleep", "echo", "printf", "cat", "mkdir", "stty", "httpd", "true", "false",
           "nc", "sha1sum", "cut", "sed", "base64", "head", "wc"]
IMAGE = "gpucloud/test-busybox-connect:" + hashlib.sha256(
    repr((APPLETS, BUSYBOX.stat().st_size if BUSYBOX.exists() else 0)).encode()).hexdigest()[:12]
# A WebSocket server in busybox sh, run by `nc -ll -e` per connection: the handshake (the
# accept key from sha1sum and base64), then "hello", then "pong" for each 4-byte message
# (a client's masked frame of "ping" is 10 bytes). Server frames are unmasked text frames.
WS_SCRIPT = r"""key=
while read -r line; do
  line=${line%$(printf '\r')}
  [ -z "$line" ] && break
  case "$line" in [Ss]ec-[Ww]eb[Ss]ocket-[Kk]ey:*) key=${line#*: };; esac
done
accept=$(printf '%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11' "$key" | sha1sum | cut -c1-40 | sed 's/../\\x&/g')
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
printf 'Sec-WebSocket-Accept: %s\r\n\r\n' "$(printf "$accept" | base64)"
printf '\201\005hello'
while [ "$(head -c 10 | wc -c)" = 10 ]; do printf '\201\004pong'; done
"""
SERVE = ["sh", "-c", "mkdir -p /www && echo served-by-busybox > /www/index.html && exec httpd -f -p 8080 -h /www"]


def _image_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("bin", "tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        for name in APPLETS:
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return buf.getvalue()


@pytest.fixture
def engine(alice) -> Iterator[docker.DockerClient]:
    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001 - any failure here means "no engine"
        pytest.fail(f"No Docker engine reachable ({e}); see .ci/run.", pytrace=False)
    try:
        c.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        if not BUSYBOX.is_file():
            pytest.fail("/bin/busybox is missing: apt-get install busybox-static", pytrace=False)
        repo, tag = IMAGE.split(":")
        c.api.import_image_from_data(_image_tar(), repository=repo, tag=tag)
    yield c
    for ctr in c.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={SCOPE}"}):
        ctr.remove(force=True)
    for net in c.networks.list(filters={"label": f"{LABEL_TENANT}={alice.tenant.pk}"}):
        net.remove()
    c.close()


@pytest.fixture
def tiny(db) -> Region:
    """One region and a type small enough for Docker's CPU limit on this 2-core machine."""
    region = Region.objects.create(code="us-east-1", name="US East", country="US")
    model = GpuModel.objects.create(code="L40S", name="L40S", vendor="nvidia", memory_gib=48,
                                    bf16_tflops=Decimal("362"), interconnect="PCIe")
    it = InstanceType.objects.create(code="l40s.1x-tiny", name="1x L40S (test)", gpu_model=model,
                                     gpu_count=1, vcpus=1, memory_gib=1, disk_gib=10)
    price_set(instance_type=it, region=region, kind="on_demand", per_hour=Decimal("0.99"))
    return region


@pytest.fixture
def connected(live_server, tiny, engine, tmp_path, triggered):  # noqa: F811
    """A RUNNING busybox instance of alice's on a Docker host whose agent tunnels to a gateway."""
    gw = GatewayThread(tmp_path)
    cfg = AgentConfig(
        server=live_server.url, bootstrap_token=bootstrap_token_create(region=tiny)[1],
        gpu_backend="sim", runtime="docker", docker_scope=SCOPE, sim_gpus=1, sim_model="L40S",
        state_dir=tmp_path / "agent", hostname=f"docker-{SCOPE}",
        gateway_url=f"ws://127.0.0.1:{gw.gw.tunnel_port}/tunnel",
    ).validated()
    backend, runtime, resources = build(cfg)
    runtime._stop_timeout_s = 2
    agent = Agent(cfg, backend=backend, runtime=runtime, resources=resources)
    agent.iterate()
    assert agent.last_ok
    tunnel = start_tunnel(cfg, agent, runtime)
    assert tunnel is not None
    try:
        yield agent, gw
    finally:
        tunnel.stop()
        gw.stop()


def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick.wait(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ssh_pty_resize_forwarding_and_sftp_into_a_busybox_container(connected, alice, tiny, tmp_path):
    agent, gw = connected
    key, pub = keypair(tmp_path, "alice")
    r = alice.client().post("/api/v1/ssh-keys", {"name": "laptop", "public_key": pub}, format="json")
    assert r.status_code == 201, r.content
    r = alice.client().post("/api/v1/instances", {
        "name": "box", "instance_type": "l40s.1x-tiny", "region": "us-east-1", "image": IMAGE,
        "command": SERVE}, format="json")
    assert r.status_code == 201, r.content
    w = Workload.objects.get(pk=r.json()["id"])
    assert run_cycle(region_id=tiny.pk).ran
    agent.iterate()
    agent.iterate()
    w.refresh_from_db()
    assert w.state == State.RUNNING, w.reason
    host_id = str(w.allocations.first().gpu.host_id)
    wait_until(lambda: host_id in gw.gw.tunnels, "the agent's tunnel")
    port = gw.gw.ssh_port

    # A command: its output and its exit status.
    out = ssh(port, key, str(w.pk), "echo hello-$((6*7)); exit 3")
    assert (out.stdout, out.returncode) == ("hello-42\n", 3), out.stderr
    # stdout and stderr stay apart without a PTY; stdin reaches the command.
    out = ssh(port, key, str(w.pk), "cat; echo oops >&2", input="from-stdin\n")
    assert (out.stdout, out.stderr, out.returncode) == ("from-stdin\n", "oops\n", 0)

    # An interactive PTY (busybox's login shell) sees a window change.
    seen: list[bytes] = []

    async def interactive() -> None:
        async with asyncssh.connect("127.0.0.1", port, username=str(w.pk), client_keys=[str(key)],
                                    known_hosts=None) as conn:
            proc = await conn.create_process(term_type="xterm", term_size=(80, 24), encoding=None)
            out = b""
            seen.append(b"")
            while b"\x1b[6n" not in out:  # the prompt is up: ash's line editor reads keys
                out += await proc.stdout.read(1024)
                seen[0] = out
            proc.stdin.write(b"stty size\r")
            while b"24 80" not in out:
                out += await proc.stdout.read(1024)
                seen[0] = out
            proc.change_terminal_size(132, 43)
            proc.stdin.write(b"stty size\r")
            while b"43 132" not in out:
                out += await proc.stdout.read(1024)
            proc.stdin.write(b"exit 4\r")
            assert (await proc.wait()).exit_status == 4
    try:
        run_in_own_loop(interactive(), 15)
    except TimeoutError:
        raise AssertionError(seen) from None

    # -L to busybox httpd in the container: the page comes back.
    local = free_port()
    fwd = subprocess.Popen(
        ["ssh", "-N", "-p", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "-o", "ExitOnForwardFailure=yes", "-L", f"127.0.0.1:{local}:localhost:8080", f"{w.pk}@127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def page() -> bytes | None:
            assert fwd.poll() is None, fwd.stderr.read() if fwd.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5) as resp:
                    return resp.read()
            except OSError:
                return None
        got: list[bytes | None] = []
        wait_until(lambda: got.append(page()) or got[-1] is not None, "the page through -L", 15)
        assert got[-1] == b"served-by-busybox\n"
    finally:
        fwd.terminate()
        fwd.wait(5)

    # busybox has no sftp-server: sftp (and scp, which speaks SFTP) is refused, plainly.
    out = subprocess.run(
        ["sftp", "-b", "-", "-P", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         f"{w.pk}@127.0.0.1"], input="ls\n", capture_output=True, text=True, timeout=20)
    assert out.returncode != 0 and "this image has no sftp-server" in out.stderr, out


def test_the_http_url_of_a_port_serves_the_busybox_containers_page_through_the_proxy(connected, alice, tiny,
                                                                                      settings):
    """The HTTP side end to end on real parts: the API publishes port 8080, the agent (docker
    runtime) runs busybox httpd there, the gateway's proxy reaches it through the tunnel."""
    agent, gw = connected
    settings.GATEWAY_PUBLIC_HTTP_URL = f"http://127.0.0.1:{gw.gw.http_port}"
    serve = ["sh", "-c", "mkdir -p /www/data && echo served-by-busybox > /www/index.html && "
                         "echo file-$((6*7)) > /www/data/f.txt && printf '%s' \"$0\" > /ws.sh && "
                         "(nc -ll -p 8081 -e sh /ws.sh &) && exec httpd -f -p 8080 -h /www", WS_SCRIPT]
    r = alice.client().post("/api/v1/instances", {
        "name": "web", "instance_type": "l40s.1x-tiny", "region": "us-east-1", "image": IMAGE,
        "command": serve, "ports": [8080, 8081]}, format="json")
    assert r.status_code == 201, r.content
    w = Workload.objects.get(pk=r.json()["id"])
    assert run_cycle(region_id=tiny.pk).ran
    agent.iterate()
    agent.iterate()
    w.refresh_from_db()
    assert w.state == State.RUNNING, w.reason
    wait_until(lambda: str(w.allocations.first().gpu.host_id) in gw.gw.tunnels, "the agent's tunnel")
    url = alice.client().get(f"/api/v1/instances/{w.pk}").json()["connect"]["urls"]["8080"]
    assert url == f"http://127.0.0.1:{gw.gw.http_port}/i/{w.pk}/8080/"

    def fetch(path: str, key: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    got: list[tuple[int, bytes]] = []
    wait_until(lambda: got.append(fetch("", alice.key)) or got[-1][0] == 200, "httpd in the container", 15)
    assert got[-1] == (200, b"served-by-busybox\n")
    assert fetch("data/f.txt", alice.key) == (200, b"file-42\n")  # the path under the prefix reaches httpd
    assert fetch("data/missing", alice.key)[0] == 404  # busybox's own 404, passed through
    assert fetch("data/f.txt")[0] == 401  # no credentials: the gateway answers, the container is not asked
    charlie = make_actor("charlie@globex.test", tenant_name="Globex")
    status, body = fetch("data/f.txt", charlie.key)
    assert status == 404 and b"file-42" not in body  # another tenant: as if there were no instance

    # A WebSocket to port 8081 (a WebSocket server in busybox sh): the upgrade, then messages both ways
    ws_url = url.replace("http://", "ws://").replace("/8080/", "/8081/")
    with ws_connect(ws_url, additional_headers={"Authorization": f"Bearer {alice.key}"}, open_timeout=10) as ws:
        assert ws.recv(timeout=10) == "hello"
        for _ in range(2):
            ws.send("ping")
            assert ws.recv(timeout=10) == "pong"
    wait_until(lambda: AuditEvent.objects.filter(tenant=alice.tenant, action="session.end",
                                                 data__kind="websocket").exists(), "the WebSocket's audit")
