"""Acceptance: the whole path on a real Docker engine.

API (alice / charlie) → `run_cycle` (the real scheduler) → the real agent (`Agent` built by
`agents.host.__main__.build` with the sim GPU backend and the docker runtime, so GPUs are
passed as environment variables only: `--docker-gpu-mode` auto = none) heartbeating to the
live server → real containers of the locally built busybox image (tests/agents/
test_docker_runtime.py) → stop / exit / host loss back through the API and the database.

The agent's loop is driven by calling `iterate()` (one reconcile pass each); liveness is
checked with `now=` instead of waiting. Everything the agent creates carries the label
`gpucloud.agent=<this run>` (`--docker-scope`), so it never touches other tests' containers
on the same engine, and is removed at the end.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import docker
import pytest
from django.conf import settings

# The scheduler's trigger is recorded, not enqueued: the test runs the cycle itself.
from test_agent_api import triggered  # noqa: F401 - a fixture, used by name

# The image comes from the docker runtime's tests: a static busybox, built locally.
from test_docker_runtime import BUSYBOX, IMAGE, _image_tar

from agents.choices import HostState
from agents.host.__main__ import build
from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.docker import LABEL_AGENT
from agents.host.egress import EgressRules
from agents.host.runtime import LABEL_INSTANCE, LABEL_MANAGED, LABEL_TENANT, container_name
from agents.models import Gpu, Host
from agents.selectors import host_desired_containers
from agents.services.liveness import hosts_check_liveness
from agents.services.registration import bootstrap_token_create
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.catalogue.services import price_set
from scheduler.choices import State
from scheduler.cycle import run_cycle
from scheduler.models import Workload

SCOPE = f"e2e-{secrets.token_hex(4)}"
# Exits promptly on `docker stop` (busybox sh runs the trap between two short sleeps).
IDLE = ["sh", "-c", "trap 'exit 0' TERM; echo up; while true; do sleep 1; done"]
SERVE = [
    "sh",
    "-c",
    "mkdir -p /www && echo served > /www/index.html && exec httpd -f -p 8080 -h /www",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
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
    c.close()


@pytest.fixture
def tenant_networks(engine, alice, charlie) -> Iterator[None]:
    yield
    for tenant in (alice.tenant, charlie.tenant):
        labels = [f"{LABEL_TENANT}={tenant.pk}", f"{LABEL_AGENT}={SCOPE}"]
        for ctr in engine.containers.list(all=True, filters={"label": labels}):
            ctr.remove(force=True)
        for net in engine.networks.list(filters={"label": f"{LABEL_TENANT}={tenant.pk}"}):
            net.remove()


@pytest.fixture
def us_east(catalog) -> Region:
    """The seeded catalogue, plus a type small enough for this 2-core machine: Docker
    refuses a CPU limit above the machine's CPUs, and every seeded type asks >= 2."""
    region = Region.objects.get(code="us-east-1")
    it = InstanceType.objects.create(
        code="l40s.2x-tiny",
        name="2x L40S (test)",
        gpu_model=GpuModel.objects.get(code="L40S"),
        gpu_count=2,
        vcpus=1,
        memory_gib=1,
        disk_gib=50,
    )
    price_set(instance_type=it, region=region, kind="on_demand", per_hour=Decimal("1.98"))
    return region


@dataclass
class DockerHost:
    agent: Agent
    cfg: AgentConfig

    @property
    def host(self) -> Host:
        return Host.objects.get(name=self.cfg.hostname)

    def beat(self, times: int = 1) -> None:
        for _ in range(times):
            self.agent.iterate()
            assert self.agent.last_ok, "the heartbeat did not reach the control plane"

    def restart(self) -> DockerHost:
        """A new agent process: same state dir (host token), fresh memory."""
        return start_agent(self.cfg)


def start_agent(cfg: AgentConfig) -> DockerHost:
    backend, runtime, resources = build(cfg)
    runtime._stop_timeout_s = 3  # busybox `sleep` may not see SIGTERM at once
    return DockerHost(Agent(cfg, backend=backend, runtime=runtime, resources=resources), cfg)


@pytest.fixture
def egress_rules() -> Iterator[None]:
    """The agent installs its egress rules (iptables, host-wide); take them out afterwards
    if they were not there before (another agent's stay)."""
    rules = EgressRules()
    before = bool(rules.iptables) and all(
        subprocess.run([rules.iptables, "-w", "10", "-C", chain, *spec], capture_output=True)
        .returncode == 0
        for chain, spec in rules.rules()
    )
    yield
    if not before:
        rules.remove()


@pytest.fixture
def docker_host(  # noqa: F811
    live_server, us_east, engine, tmp_path, triggered, egress_rules
) -> DockerHost:
    cfg = AgentConfig(
        server=live_server.url,
        bootstrap_token=bootstrap_token_create(region=us_east)[1],
        gpu_backend="sim",
        runtime="docker",
        docker_scope=SCOPE,
        sim_gpus=4,
        sim_model="L40S",
        state_dir=tmp_path / "agent",
        hostname=f"docker-{SCOPE}",
    ).validated()
    h = start_agent(cfg)
    h.beat()
    return h


def launch(actor, kind: str = "instances", **body) -> Workload:
    payload = {"name": "e2e", "instance_type": "l40s.2x-tiny", "region": "us-east-1",
               "image": IMAGE, "command": IDLE, **body}
    r = actor.client().post(f"/api/v1/{kind}", payload, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["state"] == "pending"
    return Workload.objects.get(pk=r.json()["id"])


def schedule(region: Region) -> None:
    stats = run_cycle(region_id=region.pk)
    assert stats.ran


def state(w: Workload) -> str:
    w.refresh_from_db()
    return w.state


def container_of(engine, w: Workload):
    found = engine.containers.list(
        all=True, filters={"label": [f"{LABEL_AGENT}={SCOPE}", f"gpucloud.workload={w.pk}"]}
    )
    return found


def wait_exited(engine, w: Workload, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ctrs = container_of(engine, w)
        if ctrs and all(c.status == "exited" for c in ctrs):
            return
        time.sleep(0.2)
    pytest.fail(f"the container of {w.pk} did not exit")


def test_an_instance_gets_exactly_its_gpus_and_limits_and_stop_removes_it(
    docker_host, us_east, engine, alice, charlie, tenant_networks
):
    w = launch(alice)
    schedule(us_east)
    assert state(w) == State.SCHEDULED
    held = w.allocations.filter(active=True).order_by("gpu__index")
    gpus = list(held.values_list("gpu_id", flat=True))
    assert len(gpus) == 2
    docker_host.beat(2)  # start the container; report it running
    assert state(w) == State.RUNNING
    (ctr,) = container_of(engine, w)
    assert ctr.status == "running"
    env = dict(e.split("=", 1) for e in ctr.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus)
    hc = ctr.attrs["HostConfig"]
    assert not hc.get("DeviceRequests")  # sim GPUs: no device request (docker gpu mode none)
    it = w.instance_type
    assert hc["NanoCpus"] == it.vcpus * 10**9
    assert hc["Memory"] == hc["MemorySwap"] == it.memory_gib * 1024**3
    assert hc["PidsLimit"] == settings.AGENT_PIDS_LIMIT
    assert ctr.labels[LABEL_TENANT] == str(alice.tenant.pk)
    # The log tail comes through the heartbeats.
    url = f"/api/v1/instances/{w.pk}/logs"
    assert alice.client().get(url).json()["pending"] is True
    docker_host.beat(2)
    assert "up" in alice.client().get(url).json()["text"].split()
    # Stop through the API: the agent stops the container, then removes it; GPUs are free.
    r = alice.client().post(f"/api/v1/instances/{w.pk}/stop")
    assert r.status_code == 200 and r.json()["state"] == "stopping"
    assert charlie.client().post(f"/api/v1/instances/{w.pk}/stop").status_code == 404
    docker_host.beat()  # not desired any more: stopped within this pass
    assert container_of(engine, w)[0].status == "exited"
    docker_host.beat()  # its exit reported: STOPPED, GPUs freed; the container removed
    assert state(w) == State.STOPPED
    assert not container_of(engine, w)
    assert list(Gpu.objects.filter(uuid__in=gpus).values_list("used_milli", flat=True)) == [0, 0]


def test_jobs_end_succeeded_or_failed_after_their_retries(
    docker_host, us_east, engine, alice, tenant_networks
):
    ok = launch(alice, "jobs", name="ok", command=["sh", "-c", "echo done; exit 0"])
    bad = launch(alice, "jobs", name="bad", command=["sh", "-c", "exit 3"], max_retries=1)
    schedule(us_east)
    docker_host.beat()
    wait_exited(engine, ok)
    wait_exited(engine, bad)
    docker_host.beat()
    assert state(ok) == State.SUCCEEDED and ok.exit_code == 0
    bad.refresh_from_db()
    assert (bad.state, bad.retries) == (State.PENDING, 1)  # the first attempt failed
    schedule(us_east)
    assert state(bad) == State.SCHEDULED
    docker_host.beat()  # the old attempt's container removed, the new one started
    wait_exited(engine, bad)
    docker_host.beat()
    bad.refresh_from_db()
    assert bad.state == State.FAILED and bad.exit_code == 3
    assert "exited with code 3" in bad.reason
    runs = [r for s, r in bad.events.values_list("to_state", "reason") if s == State.RUNNING]
    assert len(runs) == 2  # it ran twice
    docker_host.beat()
    assert not container_of(engine, ok) and not container_of(engine, bad)
    assert not Gpu.objects.filter(used_milli__gt=0).exists()


def test_tenants_are_isolated_a_dead_agent_loses_its_work_and_a_restart_removes_strays(
    docker_host, us_east, engine, alice, charlie, tenant_networks, live_server, region_b
):
    mine = launch(alice, name="alice-box")
    theirs = launch(charlie, name="charlie-web", command=SERVE)
    schedule(us_east)
    docker_host.beat(2)
    assert (state(mine), state(theirs)) == (State.RUNNING, State.RUNNING)
    (a,) = container_of(engine, mine)
    (b,) = container_of(engine, theirs)
    b_net = f"gpucloud-t-{charlie.tenant.pk}"
    b_ip = b.attrs["NetworkSettings"]["Networks"][b_net]["IPAddress"]
    get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {b_ip} 8080"
    # Charlie's server answers on charlie's network ...
    deadline = time.monotonic() + 20
    while b"served" not in b.exec_run(["sh", "-c", get]).output:
        assert time.monotonic() < deadline, "charlie's httpd never answered"
        time.sleep(0.2)
    # ... but alice's container cannot even open a connection to it.
    refused = a.exec_run(["sh", "-c", get])
    assert refused.exit_code != 0 and b"served" not in refused.output, refused
    assert list(a.attrs["NetworkSettings"]["Networks"]) == [f"gpucloud-t-{alice.tenant.pk}"]

    # The agent never sees another host's assignments.
    other = Host.objects.exclude(pk=docker_host.host.pk).get()
    assert host_desired_containers(host=other) == []
    assert {d.instance_id.split(".")[0] for d in docker_host.agent.desired} == {
        str(mine.pk), str(theirs.pk)
    }

    # The agent dies: no more heartbeats. DOWN after HOST_DOWN_AFTER_S, LOST after the grace.
    host = docker_host.host
    silent = host.last_heartbeat_at + timedelta(seconds=settings.HOST_DOWN_AFTER_S + 1)
    assert str(host.pk) in hosts_check_liveness(now=silent).down
    lost = silent + timedelta(seconds=settings.HOST_LOST_GRACE_S + 1)
    assert sorted(hosts_check_liveness(now=lost).lost) == sorted([str(mine.pk), str(theirs.pk)])
    assert (state(mine), state(theirs)) == (State.LOST, State.LOST)
    assert not Gpu.objects.filter(host=host, used_milli__gt=0).exists()

    # Meanwhile someone left a gpucloud container the control plane never asked for.
    stray_id = f"stray-{SCOPE}"
    stray = engine.containers.run(
        IMAGE, IDLE, detach=True, name=container_name(stray_id),
        labels={LABEL_MANAGED: "1", LABEL_INSTANCE: stray_id, LABEL_AGENT: SCOPE},
    )
    # The agent restarts: the host is back, and nothing on it is desired any more.
    again = docker_host.restart()
    assert container_of(engine, mine) and container_of(engine, theirs)  # the old ones are left too
    again.beat()  # one reconcile pass: nobody asked this agent for any of them, all are removed
    assert Host.objects.get(pk=host.pk).state == HostState.READY
    with pytest.raises(docker.errors.NotFound):
        stray.reload()
    assert not container_of(engine, mine) and not container_of(engine, theirs)


@pytest.fixture
def region_b(us_east, live_server, tmp_path):
    """A second host (the sim runtime) in the same region, registered through the API."""
    from agents.host.sim import SimGpuBackend, SimRuntime

    cfg = AgentConfig(
        server=live_server.url,
        bootstrap_token=bootstrap_token_create(region=us_east)[1],
        gpu_backend="sim",
        runtime="sim",
        sim_model="H100",
        state_dir=tmp_path / "other",
        hostname=f"other-{SCOPE}",
    ).validated()
    runtime = SimRuntime()
    agent = Agent(cfg, backend=SimGpuBackend(model="H100", count=8, hostname=cfg.hostname,
                                             runtime=runtime), runtime=runtime)
    agent.iterate()
    assert agent.last_ok
    return agent
