"""`DockerRuntime` against a real Docker engine: limits, privileges, labels, logs, stop,
what `list()` sees, and per-tenant networks that keep tenants apart.

No registry is needed: the test image is built here from the host's static busybox
(Debian's `busybox-static`). There are no GPUs here, so specs carry none. Everything a
test creates carries a tenant id unique to this run and is removed at the end. With
no engine the tests fail (never skip): `.ci/run` installs and starts one.
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
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import docker  # a requirement: missing, the module fails to import (no skipping)
import pytest

from agents.host.docker import CAP_ADD, FALLBACK_NETWORK, DockerRuntime, bridge_name
from agents.host.egress import INPUT_CHAIN, EgressRules
from agents.host.runtime import LABEL_MANAGED, LABEL_TENANT, RuntimeError_, container_name
from agents.host.standin import busybox_image
from agents.protocol import DesiredContainer

BUSYBOX = Path("/bin/busybox")
# (busybox-static's wget crashes in its static resolver even for an IP; nc does not)
APPLETS = ["sh", "sleep", "echo", "printf", "cat", "grep", "nc", "httpd", "mkdir", "true", "false"]
# The tag follows the contents, so a changed applet list builds a new image.
IMAGE = (
    "gpucloud/test-busybox:"
    + hashlib.sha256(
        repr((APPLETS, BUSYBOX.stat().st_size if BUSYBOX.exists() else 0)).encode()
    ).hexdigest()[:12]
)
RUN = secrets.token_hex(4)  # this run's mark on everything it creates
TENANT_A, TENANT_B = f"test-{RUN}-a", f"test-{RUN}-b"


def _image_tar() -> bytes:
    """A root filesystem of one static busybox and its applet links, as a tar stream."""
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


@pytest.fixture(scope="module")
def client() -> Iterator[object]:
    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001 - any failure here means "no engine"
        pytest.fail(
            f"No Docker engine reachable ({e}). Install docker.io and start "
            f"`dockerd --storage-driver=vfs &` (as .ci/run does).",
            pytrace=False,
        )
    try:
        c.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        if not BUSYBOX.is_file():
            pytest.fail("/bin/busybox is missing: apt-get install busybox-static", pytrace=False)
        repo, tag = IMAGE.split(":")
        c.api.import_image_from_data(_image_tar(), repository=repo, tag=tag)
    yield c
    # Clean up everything this run made, whatever the tests left behind.
    for ctr in c.containers.list(all=True, filters={"label": f"gpucloud.test.run={RUN}"}):
        ctr.remove(force=True)
    for tenant in (TENANT_A, TENANT_B):
        for ctr in c.containers.list(all=True, filters={"label": f"{LABEL_TENANT}={tenant}"}):
            ctr.remove(force=True)
        for net in c.networks.list(names=[f"gpucloud-t-{tenant}"]):
            net.remove()
    for net in c.networks.list(names=[FALLBACK_NETWORK]):
        try:
            net.remove()  # only when no one else's container is on it
        except docker.errors.APIError:
            pass
    c.close()


@pytest.fixture(scope="module")
def runtime(client) -> DockerRuntime:
    # nofile below any engine's limit (this sandbox's dockerd has 20000; see nofile_within_host)
    return DockerRuntime(client, gpu_vendor="nvidia", stop_timeout_s=2, disk_gib=1, nofile=4096)


def spec(
    name: str, tenant: str = TENANT_A, command: list[str] | None = None, **kw
) -> DesiredContainer:
    values = dict(
        instance_id=f"{RUN}-{name}",
        tenant_id=tenant,
        kind="instance",
        image=IMAGE,
        command=command or ["sh", "-c", "echo hello from gpucloud; sleep 300"],
        vcpus=0.5,
        memory_mib=64,
        pids_limit=64,
        network=f"gpucloud-t-{tenant}",
        labels={"gpucloud.test.run": RUN, "gpucloud.workload": name},
    )
    values.update(kw)
    return DesiredContainer(**values)


def observed(runtime: DockerRuntime, instance_id: str):
    return next((o for o in runtime.list() if o.instance_id == instance_id), None)


def wait_for(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def test_a_container_runs_with_labels_limits_and_no_privileges(client, runtime):
    s = spec("limits", ports=[8080], env={"HELLO": "world"})
    cid = runtime.run(s)
    assert runtime.run(s) == cid  # idempotent while it runs
    c = client.containers.get(cid)
    assert c.name == container_name(s.instance_id)
    labels = c.labels
    assert labels[LABEL_MANAGED] == "1" and labels["gpucloud.instance"] == s.instance_id
    assert (labels[LABEL_TENANT], labels["gpucloud.kind"]) == (TENANT_A, "instance")
    assert labels["gpucloud.workload"] == "limits"
    hc = c.attrs["HostConfig"]
    assert hc["Memory"] == hc["MemorySwap"] == 64 * 1024 * 1024  # no swap
    assert hc["NanoCpus"] == 500_000_000 and hc["PidsLimit"] == 64
    assert hc["CapDrop"] == ["ALL"] and sorted(hc["CapAdd"]) == sorted(CAP_ADD)
    assert "no-new-privileges:true" in hc["SecurityOpt"]
    assert hc["Privileged"] is False and hc["Init"] is True
    assert hc["RestartPolicy"]["Name"] == "no" and hc["ShmSize"] == 64 * 1024 * 1024
    env = dict(e.split("=", 1) for e in c.attrs["Config"]["Env"])
    assert env["HELLO"] == "world" and env["NVIDIA_VISIBLE_DEVICES"] == "void"  # no GPU given
    assert list(c.attrs["NetworkSettings"]["Networks"]) == [f"gpucloud-t-{TENANT_A}"]
    # What the kernel enforces inside, not only what Docker was told.
    code, out = c.exec_run(["grep", "-E", "^(NoNewPrivs|CapEff)", "/proc/self/status"])
    status = dict(line.split(":\t") for line in out.decode().strip().splitlines())
    assert code == 0 and status["NoNewPrivs"] == "1"
    cap_net_raw = 1 << 13
    assert int(status["CapEff"], 16) & cap_net_raw == 0
    # Published on loopback only (the agent's connect path), nofile as the kernel sees it.
    assert hc["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    assert hc["Ulimits"] == [{"Name": "nofile", "Soft": 4096, "Hard": 4096}]
    code, out = c.exec_run(["sh", "-c", "ulimit -n; ulimit -Hn"])
    assert code == 0 and out.decode().split() == ["4096", "4096"]
    binds = c.attrs["NetworkSettings"]["Ports"]["8080/tcp"]
    assert binds and all(b["HostIp"] == "127.0.0.1" for b in binds)
    o = wait_for(lambda: observed(runtime, s.instance_id), "the container in list()")
    assert o.state == "running" and o.container_id == cid and o.started_at
    assert set(o.host_ports) == {"8080"} and o.host_ports["8080"] > 0
    assert "hello from gpucloud" in wait_for(lambda: runtime.logs(s.instance_id, tail=10), "logs")


def test_stop_is_idempotent_and_reports_the_exit(client, runtime):
    s = spec("stop")
    runtime.run(s)
    runtime.stop(s.instance_id)
    o = observed(runtime, s.instance_id)
    assert o.state == "exited" and o.exit_code in (137, 143) and o.finished_at
    runtime.stop(s.instance_id)  # again: nothing to do, no error
    runtime.stop(f"{RUN}-never-existed")
    runtime.remove(s.instance_id)
    runtime.remove(s.instance_id)
    assert observed(runtime, s.instance_id) is None


def test_a_checkpoint_signal_reaches_the_job_which_keeps_running(client, runtime):
    s = spec("ckpt", kind="job", checkpoint_signal="SIGUSR1", checkpoint_grace_s=5, command=[
        "sh", "-c", 'trap "echo checkpoint saved" USR1; echo ready; while true; do sleep 0.2; done'])
    runtime.run(s)
    wait_for(lambda: "ready" in runtime.logs(s.instance_id), "the job to start")
    runtime.signal(s.instance_id, "SIGUSR1")
    wait_for(lambda: "checkpoint saved" in runtime.logs(s.instance_id), "the trap to run")
    assert observed(runtime, s.instance_id).state == "running"  # it handled the signal
    with pytest.raises(RuntimeError_):
        runtime.signal(s.instance_id, "SIGKILL")  # only the checkpoint signals
    runtime.signal(f"{RUN}-never-existed", "SIGUSR1")  # no-op
    runtime.remove(s.instance_id)


def test_a_job_reports_its_exit_code_and_a_rerun_replaces_it(client, runtime):
    s = spec("job", kind="job", command=["sh", "-c", "echo working; exit 3"])
    first = runtime.run(s)
    o = wait_for(
        lambda: (x := observed(runtime, s.instance_id)) and x.state == "exited" and x,
        "the job to exit",
    )
    assert o.exit_code == 3 and o.started_at and o.finished_at
    assert "working" in runtime.logs(s.instance_id)
    assert runtime.run(s) != first  # a stopped container is replaced, not restarted


def test_list_shows_only_gpucloud_containers(client, runtime):
    plain = client.containers.run(
        IMAGE, ["sleep", "300"], detach=True, name=f"plain-{RUN}", labels={"gpucloud.test.run": RUN}
    )
    half = client.containers.run(
        IMAGE,
        ["sleep", "300"],
        detach=True,
        name=f"half-{RUN}",
        labels={"gpucloud.test.run": RUN, LABEL_MANAGED: "1"},
    )
    s = spec("listed")
    runtime.run(s)
    ids = {o.container_id for o in runtime.list()}
    assert plain.id not in ids and half.id not in ids  # unlabelled / without an instance: not ours
    assert observed(runtime, s.instance_id) is not None
    runtime.stop(plain.name)  # by instance id: "plain-…" is no instance, so nothing happens
    plain.reload()
    assert plain.status == "running"


def _ip(client, instance_id: str, tenant: str) -> str:
    c = client.containers.get(container_name(instance_id))
    return c.attrs["NetworkSettings"]["Networks"][f"gpucloud-t-{tenant}"]["IPAddress"]


def test_tenants_cannot_reach_each_others_containers(client, runtime):
    serve = [
        "sh",
        "-c",
        "mkdir -p /www && echo served > /www/index.html && httpd -f -p 8080 -h /www",
    ]
    a_server, a_client, b_server = (
        spec("a-srv", command=serve),
        spec("a-cli"),
        spec("b-srv", tenant=TENANT_B, command=serve),
    )
    for s in (a_server, a_client, b_server):
        runtime.run(s)
    nets = {
        n.name: n
        for n in client.networks.list(names=[f"gpucloud-t-{TENANT_A}", f"gpucloud-t-{TENANT_B}"])
    }
    assert set(nets) == {f"gpucloud-t-{TENANT_A}", f"gpucloud-t-{TENANT_B}"}
    assert nets[f"gpucloud-t-{TENANT_B}"].attrs["Labels"][LABEL_TENANT] == TENANT_B
    a_ip = _ip(client, a_server.instance_id, TENANT_A)
    b_ip = _ip(client, b_server.instance_id, TENANT_B)
    cli = client.containers.get(container_name(a_client.instance_id))

    def fetch(container, ip: str):
        get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080"
        return container.exec_run(["sh", "-c", get])  # exit status: nc's

    # Same tenant: reachable (once httpd listens).
    wait_for(lambda: b"served" in fetch(cli, a_ip).output, "tenant A's server, from tenant A")
    # Tenant B's server answers on its own network ...
    b_cli = client.containers.run(
        IMAGE,
        ["sleep", "300"],
        detach=True,
        name=f"b-probe-{RUN}",
        network=f"gpucloud-t-{TENANT_B}",
        labels={"gpucloud.test.run": RUN},
    )
    wait_for(lambda: b"served" in fetch(b_cli, b_ip).output, "tenant B's server, from tenant B")
    # ... but never to tenant A: the connection does not open.
    refused = fetch(cli, b_ip)
    assert refused.exit_code != 0 and b"served" not in refused.output, refused
    assert b"not found" not in refused.output, refused  # it failed for the right reason


def test_the_host_caps_pids_and_the_disk_limit_follows_the_storage_driver(client):
    capped = DockerRuntime(client, stop_timeout_s=2, pids_limit=32, disk_gib=1, nofile=4096)
    s = spec("capped")  # asks for 64
    c = client.containers.get(capped.run(s))
    assert c.attrs["HostConfig"]["PidsLimit"] == 32
    info = client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if info["Driver"] in ("overlay2", "vfs") and backing != "xfs":
        # This engine (vfs, as .ci/run starts it) cannot limit a writable layer: said plainly.
        assert capped.disk_quota.startswith(f"not applied: storage driver {info['Driver']}")
        assert not c.attrs["HostConfig"].get("StorageOpt")
    else:
        applied = capped.disk_quota == "applied"
        assert applied == (c.attrs["HostConfig"].get("StorageOpt") == {"size": "1G"})


def test_tenant_networks_use_gct_bridges_and_the_shared_one_has_no_icc(client, runtime):
    s = spec("net-a")
    runtime.run(s)
    [net] = [n for n in client.networks.list(names=[s.network]) if n.name == s.network]
    assert net.attrs["Options"]["com.docker.network.bridge.name"] == bridge_name(s.network)
    loose = spec("no-net", network="")
    c = client.containers.get(runtime.run(loose))
    assert list(c.attrs["NetworkSettings"]["Networks"]) == [FALLBACK_NETWORK]
    [shared] = [n for n in client.networks.list(names=[FALLBACK_NETWORK])
                if n.name == FALLBACK_NETWORK]
    assert shared.attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert shared.attrs["Options"]["com.docker.network.bridge.name"].startswith("gct")


class Listener:
    """A TCP listener on one host address that answers every connection with a word."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_server((address, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"host-secret\n")

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def _rules_present(rules: EgressRules) -> bool:
    return all(
        subprocess.run([rules.iptables, "-w", "10", "-C", chain, *spec], capture_output=True)
        .returncode == 0
        for chain, spec in rules.rules()
    )


def test_tenant_containers_cannot_reach_the_host_but_the_connect_path_still_works(
    client, runtime
):
    serve = ["sh", "-c", "mkdir -p /www && echo served > /www/index.html && httpd -f -p 8080 -h /www"]
    s = spec("egress", command=serve, ports=[8080])
    c = client.containers.get(runtime.run(s))
    [net] = [n for n in client.networks.list(names=[s.network]) if n.name == s.network]
    gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]  # an address of this host
    listener = Listener(gateway)
    rules = EgressRules()
    ours = not _rules_present(rules)  # rules another agent installed stay as they are

    def dial():  # nc gives up after 2 s: the bound on each try
        probe = f"nc -w 2 {gateway} {listener.port} </dev/null"
        return c.exec_run(["sh", "-c", probe])

    try:
        if ours:  # without the rules, the host's address is reachable: the test can fail
            assert b"host-secret" in wait_for(lambda: dial().output or None, "the listener")
        assert rules.install() is None, "iptables works here (root, as .ci/run runs)"
        assert _rules_present(rules) and rules.install() is None  # idempotent
        refused = dial()
        assert b"host-secret" not in refused.output and refused.exit_code != 0, refused
        # The connect path: the agent, on this host, reaches the published port on loopback.
        c.reload()
        port = int(c.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]["HostPort"])

        def fetch() -> bytes:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                    conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    return conn.recv(4096)
            except OSError:
                return b""

        assert b"served" in wait_for(lambda: (b := fetch()) and b"served" in b and b, "httpd")
    finally:
        listener.close()
        if ours:
            rules.remove()


def test_the_egress_chain_is_repaired_and_concurrent_installs_keep_it_in_order(client):
    """The demo's three agents install at once on one host: interleaved flush-and-refill
    left DROP ahead of the RETURN for replies (the connect path then timed out)."""
    rules = EgressRules()
    ours = not _rules_present(rules)
    ipt = [rules.iptables, "-w", "10"]

    def chain() -> list[str]:
        out = subprocess.run([*ipt, "-S", INPUT_CHAIN], capture_output=True, text=True, check=True)
        return [line for line in out.stdout.splitlines() if line.startswith("-A ")]

    right = [f"-A {INPUT_CHAIN} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
             f"-A {INPUT_CHAIN} -j DROP"]
    try:
        assert rules.install() is None
        # What the race left behind: the DROP first.
        subprocess.run([*ipt, "-I", INPUT_CHAIN, "1", "-j", "DROP"], check=True)
        assert chain() != right
        assert rules.install() is None and chain() == right  # repaired
        gate = threading.Barrier(6)
        results: list[str | None] = []

        def install() -> None:
            gate.wait(10)
            results.append(EgressRules().install())

        threads = [threading.Thread(target=install) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [None] * 6 and chain() == right
    finally:
        if ours:
            rules.remove()


def test_an_image_the_engine_lacks_runs_as_the_stand_in_which_says_so(client):
    standin = busybox_image(client)
    assert busybox_image(client) == standin  # built once; the tag follows the binary
    rt = DockerRuntime(client, gpu_vendor="none", stop_timeout_s=2, nofile=4096, image_fallback=standin)
    present = spec("present", command=["sh", "-c", "echo as-asked"], kind="job")
    client.containers.get(rt.run(present))
    # More CPUs than the engine has (a simulated 8x H100 host's types): capped, not refused.
    assert rt.run_kwargs(spec("cpus", vcpus=10_000))["nano_cpus"] == int(client.info()["NCPU"] * 1e9)
    assert wait_for(lambda: (o := observed(rt, present.instance_id)) and o.state == "exited" and o,
                    "the job").exit_code == 0
    assert rt.logs(present.instance_id) == "as-asked\n"  # an image the engine has: no stand-in
    assert client.containers.get(container_name(present.instance_id)).image.tags == [IMAGE]

    notice = (f"gpucloud: image registry.invalid/absent:1 is not on this host and is not pulled here; "
              f"running the stand-in image {standin} (busybox) in its place\n")
    job = spec("standin-job", image="registry.invalid/absent:1", command=["sh", "-c", "echo ran-$((6*7)); exit 3"],
               kind="job")
    assert client.containers.get(rt.run(job)).image.tags == [standin]
    assert wait_for(lambda: (o := observed(rt, job.instance_id)) and o.state == "exited" and o,
                    "the job").exit_code == 3  # the command ran as asked, on the stand-in
    assert rt.logs(job.instance_id) == notice + "ran-42\n"

    # No command: busybox httpd answers on each published port with the same words, at any path.
    web = replace(spec("standin-web", image="registry.invalid/absent:1", ports=[8888]), command=[])
    c = client.containers.get(rt.run(web))

    def fetch(path: str) -> bytes:
        c.reload()
        try:
            port = int(c.attrs["NetworkSettings"]["Ports"]["8888/tcp"][0]["HostPort"])
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
                conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
                return b"".join(iter(lambda: conn.recv(4096), b""))
        except (OSError, KeyError, IndexError, TypeError):
            return b""

    page = wait_for(lambda: (b := fetch("/")) and b"stand-in" in b and b, "the stand-in's page")
    assert page.startswith(b"HTTP/1.1 200") and notice.strip().encode() in page
    assert notice.strip().encode() in fetch("/i/x/8888/lab")
    assert rt.logs(web.instance_id) == notice
    assert observed(rt, web.instance_id).state == "running"  # sleeps until stopped
    rt.remove(web.instance_id)
