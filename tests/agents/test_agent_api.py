"""The agent protocol end to end: the real daemon (in process, and as `python -m agents.host`)
against the real Django app on a live server, over real HTTP, on PostgreSQL.

Workloads are placed by hand here (Workload + Allocation rows and booking counters, as
the scheduler's apply does), so these tests prove the agent side on its own. The
scheduler's trigger is recorded instead of run, so a requeued job stays PENDING.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as dj_settings
from django.utils import timezone

from agents import fastpath
from agents.choices import HostState
from agents.host.config import AgentConfig
from agents.host.daemon import Agent
from agents.host.sim import SimGpuBackend, SimRuntime
from agents.host.state import clear_state
from agents.models import BootstrapToken, Gpu, Host
from agents.selectors import hash_token, host_desired_containers
from agents.services.host_ops import host_replace_allow
from agents.services.liveness import hosts_check_liveness
from agents.services.registration import bootstrap_token_create
from agents.tasks import hosts_liveness_task
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.tenancy.models import AuditEvent
from scheduler.choices import State
from scheduler.models import Allocation, Workload
from scheduler.services import workload_requeue_or_end, workload_stop, workload_transition

REPO = Path(__file__).resolve().parents[2]


class Clock:
    """The sim runtime's clock: jobs finish when the test says so, not after real seconds."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def triggered(monkeypatch) -> list[int]:
    """Record the scheduler's 'run a cycle' requests instead of enqueueing them."""
    calls: list[int] = []
    monkeypatch.setattr("scheduler.tasks.trigger_cycle", calls.append)
    return calls


@pytest.fixture
def region(db) -> Region:
    """The slice of the catalogue these tests use (seed_catalog's prices cost seconds per test)."""
    east = Region.objects.create(code="us-east-1", name="US East", country="US")
    Region.objects.create(code="eu-central-1", name="EU Central", country="DE")
    for code, vcpus, ram in (("H100", 24, 240), ("L40S", 12, 64)):
        model = GpuModel.objects.create(
            code=code,
            name=code,
            vendor="nvidia",
            memory_gib=80,
            bf16_tflops=Decimal("989.4"),
            interconnect="NVLink",
        )
        for n in (1, 2):
            InstanceType.objects.create(
                code=f"{code.lower()}.{n}x",
                name=f"{n}x {code}",
                gpu_model=model,
                gpu_count=n,
                vcpus=vcpus * n,
                memory_gib=ram * n,
                disk_gib=100,
            )
    return east


def new_token(region: Region, **kwargs) -> str:
    return bootstrap_token_create(region=region, **kwargs)[1]


@dataclass
class SimHost:
    agent: Agent
    runtime: SimRuntime
    backend: SimGpuBackend
    clock: Clock

    @property
    def host(self) -> Host:
        return Host.objects.get(name=self.agent.config.hostname)

    def gpus(self) -> list[Gpu]:
        fastpath.heartbeats_flush()  # samples wait in the fast path's buffer (up to a second)
        return list(Gpu.objects.filter(host__name=self.agent.config.hostname).order_by("index"))

    def beat(self, times: int = 1) -> None:
        for _ in range(times):
            self.agent.iterate()
            assert self.agent.last_ok, "the heartbeat did not reach the control plane"


@pytest.fixture
def make_sim_host(live_server, region, tmp_path, triggered):
    def make(
        name: str = "sim-a",
        model: str = "H100",
        count: int = 8,
        token: str | None = None,
        fail_images: frozenset[str] = frozenset(),
    ) -> SimHost:
        clock = Clock()
        runtime = SimRuntime(clock=clock, fail_images=fail_images)
        backend = SimGpuBackend(model=model, count=count, hostname=name, runtime=runtime)
        cfg = AgentConfig(
            server=live_server.url,
            bootstrap_token=token or new_token(region),
            gpu_backend="sim",
            runtime="sim",
            state_dir=tmp_path / name,
            hostname=name,
            request_timeout_s=10,
        ).validated()
        agent = Agent(cfg, backend=backend, runtime=runtime, resources=(224, 2 * 1024 * 1024))
        return SimHost(agent, runtime, backend, clock)

    return make


def place(
    host: Host,
    tenant,
    *,
    kind: str = "instance",
    it_code: str = "h100.1x",
    env=None,
    max_retries: int = 0,
    image: str = "gpucloud/test:1",
) -> Workload:
    it = InstanceType.objects.get(code=it_code)
    w = Workload.objects.create(
        tenant=tenant,
        kind=kind,
        name=f"{kind}-{it_code}",
        instance_type=it,
        region=host.region,
        image=image,
        command=["python", "train.py"],
        env=env or {},
        ports=[8888] if kind == "instance" else [],
        max_retries=max_retries,
    )
    return allocate(host, w)


def allocate(host: Host, w: Workload) -> Workload:
    """What the scheduler's apply does: book GPUs, CPU and memory, allocate, go SCHEDULED."""
    it = w.instance_type
    host.refresh_from_db()
    free = list(
        Gpu.objects.filter(host=host, whole=False, used_milli=0).order_by("index")[: it.gpu_count]
    )
    assert len(free) == it.gpu_count
    memory_mib = it.memory_gib * 1024
    for i, g in enumerate(free):
        Allocation.objects.create(
            gpu=g,
            host=host,
            workload=w,
            milli=1000,
            vcpus=it.vcpus if i == 0 else 0,
            memory_mib=memory_mib if i == 0 else 0,
        )
    Gpu.objects.filter(uuid__in=[g.uuid for g in free]).update(whole=True, used_milli=1000)
    Host.objects.filter(pk=host.pk).update(
        used_vcpus=host.used_vcpus + it.vcpus, used_memory_mib=host.used_memory_mib + memory_mib
    )
    assert workload_transition(workload=w, to=State.SCHEDULED, reason="placed by the test")
    return w


def state(w: Workload) -> str:
    w.refresh_from_db()
    return w.state


def events(w: Workload) -> list[tuple[str, str]]:
    return list(w.events.values_list("to_state", "reason"))


# --- registration --------------------------------------------------------------------


def test_register_creates_the_host_and_its_8_gpus_and_consumes_the_token(make_sim_host, region):
    sim = make_sim_host()
    sim.beat()
    host = sim.host
    assert (host.region, host.state, host.vcpus) == (region, HostState.READY, 224)
    assert str(host.pk) == sim.agent.host_id
    assert host.token_hash == hash_token(sim.agent.state.host_token)
    gpus = sim.gpus()
    assert [g.uuid for g in gpus] == sim.backend.uuids
    assert {g.gpu_model.code for g in gpus} == {"H100"}
    assert {g.nvlink_island for g in gpus} == {0}  # one NVSwitch fabric
    assert all(g.memory_mib == 81559 and g.sampled_at for g in gpus)
    token = BootstrapToken.objects.get()
    assert token.used_at is not None and token.host == host
    assert host.last_seq == 1 and host.last_heartbeat_at is not None


def test_gpus_without_nvlink_get_an_island_each(make_sim_host):
    sim = make_sim_host(name="sim-l40s", model="L40S", count=4)
    sim.beat()
    islands = [g.nvlink_island for g in sim.gpus()]
    assert len(set(islands)) == 4 and all(i < 0 for i in islands)
    assert {g.gpu_model.code for g in sim.gpus()} == {"L40S"}


def test_the_real_daemon_registers_and_heartbeats_once(live_server, region, tmp_path, triggered):
    token = new_token(region)
    argv = [
        sys.executable,
        "-m",
        "agents.host",
        "--server",
        live_server.url,
        "--bootstrap-token",
        token,
        "--gpu-backend",
        "sim",
        "--runtime",
        "sim",
        "--sim-gpus",
        "8",
        "--sim-model",
        "H100",
        "--state-dir",
        str(tmp_path / "state"),
        "--hostname",
        "sim-cli",
        "--once",
    ]
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    host = Host.objects.get(name="sim-cli")
    assert host.gpus.count() == 8
    saved = json.loads((tmp_path / "state" / "host.json").read_text())
    assert saved["host_id"] == str(host.pk)
    # Again: the saved host token is used; the spent bootstrap token is not needed.
    second = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert Host.objects.count() == 1 and Host.objects.get().last_seq == 1


def test_a_wiped_host_re_registers_only_once_an_operator_allows_the_replacement(
    make_sim_host, region, alice
):
    sim = make_sim_host()
    sim.beat()
    old_token = sim.agent.state.host_token
    w = place(sim.host, alice.tenant)
    sim.beat(2)
    assert state(w) == State.RUNNING
    # The agent's disk was wiped: it registers again, with a fresh bootstrap token, and no
    # proof that it is that machine: refused, and nothing changes.
    clear_state(sim.agent.config.state_dir)
    again = make_sim_host(token=new_token(region))
    again.runtime._containers = sim.runtime._containers  # the same machine's containers
    again.agent.iterate()
    assert not again.agent.last_ok and again.agent.state is None
    sim.beat()  # the host's own agent is unaffected
    # The operator allows the replacement: the next registration takes the host over.
    host_replace_allow(host=sim.host)
    again.beat()
    assert again.agent.host_id == sim.agent.host_id and again.agent.state.host_token != old_token
    assert Host.objects.count() == 1 and Host.objects.get().replace_allowed_at is None
    assert BootstrapToken.objects.filter(used_at__isnull=True).count() == 0
    gpu0 = again.gpus()[0]
    assert (gpu0.whole, gpu0.used_milli) == (True, 1000)
    assert state(w) == State.RUNNING and Allocation.objects.get(workload=w).active
    sim.agent.iterate()
    assert not sim.agent.last_ok  # the old token is revoked
    assert list(
        AuditEvent.objects.filter(object_id=str(sim.host.pk))
        .order_by("created_at", "pk")
        .values_list("action", flat=True)
    ) == ["host.register", "host.register_refused", "host.replace_allow", "host.replace"]
    # One takeover per permission: the next token without proof is refused again.
    clear_state(again.agent.config.state_dir)
    third = make_sim_host(token=new_token(region))
    third.agent.iterate()
    assert not third.agent.last_ok


# --- the lifecycle through heartbeats -------------------------------------------------


def test_a_placed_instance_is_desired_started_and_becomes_running(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    host = sim.host
    w = place(host, alice.tenant)
    sim.beat()  # heartbeat 2: the answer carries the instance; the agent starts it
    [d] = sim.agent.desired
    gpu0 = sim.gpus()[0]
    assert d.instance_id.startswith(f"{w.pk}.")
    assert (d.tenant_id, d.kind, d.image, d.command) == (
        str(alice.tenant.pk),
        "instance",
        "gpucloud/test:1",
        ["python", "train.py"],
    )
    assert (d.gpu_uuids, d.gpu_milli, d.vcpus, d.memory_mib) == (
        [gpu0.uuid],
        1000,
        24.0,
        240 * 1024,
    )
    assert (d.pids_limit, d.network, d.ports) == (4096, f"gpucloud-t-{alice.tenant.pk}", [8888])
    assert d.labels["gpucloud.workload"] == str(w.pk)
    assert [o.state for o in sim.runtime.list()] == ["running"]
    assert state(w) == State.SCHEDULED
    sim.beat()  # heartbeat 3 reports it running
    assert state(w) == State.RUNNING and w.started_at is not None
    assert events(w)[-1] == (State.RUNNING, "container running")
    gpus = sim.gpus()
    assert gpus[0].utilisation > 0.4 and gpus[0].idle_since is None and gpus[0].memory_used_mib > 0
    assert all(g.utilisation < 0.05 and g.idle_since is not None for g in gpus[1:])


def test_a_job_that_exits_0_succeeds_and_its_gpus_are_freed(make_sim_host, alice, triggered):
    sim = make_sim_host()
    sim.beat()
    w = place(
        sim.host, alice.tenant, kind="job", it_code="h100.2x", env={"GPUCLOUD_SIM_DURATION_S": "30"}
    )
    sim.beat()
    assert sim.runtime.list()[0].state == "running"
    sim.clock.advance(31)
    sim.beat()  # reports the exit (the job finished between two heartbeats)
    assert state(w) == State.SUCCEEDED and w.exit_code == 0 and w.ended_at is not None
    assert [s for s, _ in events(w)] == [State.SCHEDULED, State.RUNNING, State.SUCCEEDED]
    assert not Allocation.objects.filter(workload=w, active=True).exists()
    assert all((g.whole, g.used_milli) == (False, 0) for g in sim.gpus())
    host = sim.host
    assert (host.used_vcpus, host.used_memory_mib) == (0, 0)
    assert triggered, "freed GPUs ask the scheduler for a cycle"
    sim.beat()  # no longer desired: the agent removes the exited container
    assert sim.agent.desired == [] and sim.runtime.list() == []


def test_a_failing_job_with_retries_left_is_requeued(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    w = place(
        sim.host,
        alice.tenant,
        kind="job",
        max_retries=1,
        env={"GPUCLOUD_SIM_DURATION_S": "5", "GPUCLOUD_SIM_EXIT_CODE": "3"},
    )
    sim.beat(2)
    assert state(w) == State.RUNNING
    sim.clock.advance(6)
    sim.beat()
    assert state(w) == State.PENDING and (w.retries, w.exit_code) == (1, 3)
    assert events(w)[-2] == (State.FAILED, "container exited with code 3")
    assert not Allocation.objects.filter(workload=w, active=True).exists()


def test_an_instance_whose_container_exits_fails(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, alice.tenant, env={"GPUCLOUD_SIM_DURATION_S": "1"})
    sim.beat()
    sim.clock.advance(2)
    sim.beat()
    assert state(w) == State.FAILED and w.reason == "container exited with code 0"


def test_an_image_that_cannot_start_fails_the_workload(make_sim_host, alice):
    sim = make_sim_host(fail_images=frozenset({"nope/missing:1"}))
    sim.agent.clock = sim.clock  # its backoff between attempts on the test's clock
    sim.beat()
    w = place(sim.host, alice.tenant, image="nope/missing:1")
    sim.beat(2)  # the start fails; the next heartbeat reports it missing, with the error
    assert state(w) == State.SCHEDULED  # tried again after a backoff, and said so meanwhile
    assert w.reason == "start failed (attempt 1 of 3), trying again: pull access denied for nope/missing:1"
    for _ in range(2):  # WORKLOAD_START_ATTEMPTS (3) failed starts in all
        sim.clock.advance(60)
        sim.beat()
    sim.beat()
    assert state(w) == State.FAILED
    assert w.reason == "could not start (after 3 attempts): pull access denied for nope/missing:1"
    assert len([c for c in sim.runtime.calls if c[0] == "run"]) == 3  # then given up, not tried forever
    assert not Allocation.objects.filter(workload=w, active=True).exists()  # its GPUs freed


def test_stop_makes_the_agent_stop_the_container_within_one_interval(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, alice.tenant)
    sim.beat(2)
    assert state(w) == State.RUNNING
    workload_stop(workload=w)
    assert state(w) == State.STOPPING
    sim.beat()  # invariant 5: the very next heartbeat stops it
    [o] = sim.runtime.list()
    assert (o.state, o.exit_code) == ("exited", 143)
    assert state(w) == State.STOPPING  # the control plane learns it at the next report
    sim.beat()
    assert state(w) == State.STOPPED and w.exit_code == 143
    assert not Allocation.objects.filter(workload=w, active=True).exists()
    sim.beat()
    assert sim.runtime.list() == []


def test_reports_about_another_hosts_work_change_nothing(make_sim_host, alice):
    a, b = make_sim_host("sim-a"), make_sim_host("sim-b")
    a.beat()
    b.beat()
    w = place(b.host, alice.tenant)
    b.beat()
    [d] = b.agent.desired
    # Host A claims B's container exited: it is not A's to report.
    a.runtime.run(d)
    a.runtime.stop(d.instance_id)
    a.beat()
    assert state(w) == State.SCHEDULED
    assert a.agent.desired == []


def test_a_host_that_stops_heartbeating_goes_down_then_its_work_is_lost(make_sim_host, alice):
    sim = make_sim_host()
    sim.beat()
    job = place(sim.host, alice.tenant, kind="job")
    inst = place(sim.host, alice.tenant, kind="instance")
    sim.beat(2)
    assert state(job) == state(inst) == State.RUNNING
    seen = sim.host.last_heartbeat_at
    assert hosts_check_liveness(now=seen + timedelta(seconds=29)).down == []
    out = hosts_check_liveness(now=seen + timedelta(seconds=31))
    host = sim.host
    assert out.down == [str(host.pk)] and host.state == HostState.DOWN
    assert state(job) == state(inst) == State.RUNNING  # within the grace period nothing is lost
    assert hosts_check_liveness(now=host.down_since + timedelta(seconds=119)).lost == []
    out = hosts_check_liveness(now=host.down_since + timedelta(seconds=121))
    assert sorted(out.lost) == sorted([str(job.pk), str(inst.pk)])
    assert state(inst) == State.LOST
    assert state(job) == State.PENDING and job.retries == 0  # host loss spends no retry
    assert [s for s, _ in events(job)][-2:] == [State.LOST, State.PENDING]
    assert not Allocation.objects.filter(active=True).exists()
    assert all(not g.whole and g.used_milli == 0 for g in sim.gpus())
    # The host comes back: READY again, and its lost containers are stopped.
    sim.beat()
    assert sim.host.state == HostState.READY and sim.host.down_since is None
    assert sim.agent.desired == []
    assert {o.state for o in sim.runtime.list()} == {"exited"}


def test_the_liveness_task_marks_silent_hosts_down(make_sim_host):
    sim = make_sim_host()
    sim.beat()
    Host.objects.update(last_heartbeat_at=timezone.now() - timedelta(seconds=600))
    assert hosts_liveness_task.apply().get() == {"down": 1, "lost": 0}
    assert sim.host.state == HostState.DOWN


def test_the_real_daemon_runs_and_stops_an_instance(
    live_server, region, tmp_path, alice, triggered, settings
):
    settings.AGENT_HEARTBEAT_INTERVAL_S = 1  # the live server tells the agent its interval
    argv = [
        sys.executable,
        "-m",
        "agents.host",
        "--server",
        live_server.url,
        "--bootstrap-token",
        new_token(region),
        "--gpu-backend",
        "sim",
        "--runtime",
        "sim",
        "--sim-gpus",
        "8",
        "--sim-model",
        "H100",
        "--state-dir",
        str(tmp_path),
        "--hostname",
        "sim-daemon",
        "--log-level",
        "DEBUG",
    ]
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log.open("w"))

    def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}")

    try:
        wait_for(lambda: Host.objects.filter(name="sim-daemon").exists(), "registration")
        w = place(Host.objects.get(name="sim-daemon"), alice.tenant)
        # The assignment rides the next heartbeat's answer: with 1 s heartbeats it is
        # RUNNING well inside the deadline (a daemon that waited for a slower resync would not be).
        wait_for(lambda: state(w) == State.RUNNING, "RUNNING", timeout=15.0)
        workload_stop(workload=w)
        wait_for(lambda: state(w) == State.STOPPED, "STOPPED")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0  # SIGTERM: finish the iteration, exit 0


# --- refusals: in the one error shape, changing nothing -------------------------------


def post(client, path: str, body, token: str | None = None, raw: bytes | None = None):
    extra = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body)
    return client.post(path, data=data, content_type="application/json", **extra)


def register_body(
    token: str, hostname: str = "h1", model: str = "NVIDIA H100 80GB HBM3", gpus: int = 2
) -> dict:
    return {
        "protocol_version": 1,
        "bootstrap_token": token,
        "hostname": hostname,
        "agent_version": "test",
        "gpu_backend": "sim",
        "runtime": "sim",
        "cpu_count": 64,
        "memory_mib": 512 * 1024,
        "gpus": [
            {
                "uuid": f"GPU-{hostname}-{i}",
                "index": i,
                "model": model,
                "vendor": "nvidia",
                "memory_mib": 81559,
            }
            for i in range(gpus)
        ],
    }


def assert_error(resp, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "fields"}
    if code:
        assert body["error"]["code"] == code
    return body["error"]


@pytest.fixture
def registered(client, region, triggered) -> tuple[str, str]:
    resp = post(client, "/agent/v1/register", register_body(new_token(region)))
    assert resp.status_code == 200, resp.content
    return resp.json()["host_id"], resp.json()["host_token"]


def beat_body(host_id: str, seq: int = 1, containers=(), gpus=()) -> dict:
    return {
        "protocol_version": 1,
        "host_id": host_id,
        "seq": seq,
        "agent_version": "test",
        "gpus": list(gpus),
        "containers": None if containers is None else list(containers),
    }


def test_a_used_bootstrap_token_is_refused(client, region, triggered):
    token = new_token(region)
    assert post(client, "/agent/v1/register", register_body(token)).status_code == 200
    err = assert_error(
        post(client, "/agent/v1/register", register_body(token, "h2")), 401, "authentication_failed"
    )
    assert "already used" in err["message"]
    assert not Host.objects.filter(name="h2").exists()


@pytest.mark.parametrize("kind", ["unknown", "expired"])
def test_unknown_and_expired_bootstrap_tokens_are_refused(client, region, kind):
    token = "gpb_nope" if kind == "unknown" else new_token(region, expires_at=timezone.now())
    assert_error(
        post(client, "/agent/v1/register", register_body(token)), 401, "authentication_failed"
    )
    assert not Host.objects.exists()


def test_an_unknown_gpu_model_is_refused_naming_the_gpu(client, region):
    token = new_token(region)
    err = assert_error(
        post(client, "/agent/v1/register", register_body(token, model="Voodoo 5")),
        400,
        "validation_error",
    )
    assert list(err["fields"]) == ["gpus[0].model", "gpus[1].model"]
    assert not Host.objects.exists() and BootstrapToken.objects.get().used_at is None


def test_a_host_name_of_another_region_is_refused(client, region, registered):
    other = Region.objects.get(code="eu-central-1")
    assert_error(
        post(client, "/agent/v1/register", register_body(new_token(other))),
        409,
        "host_in_other_region",
    )


def test_an_unused_bootstrap_token_cannot_take_over_an_existing_host(
    client, region, registered, alice, charlie
):
    """The takeover of the security issue, exactly: host A registers with token T1 and runs
    two tenants' work (with secrets in `env`); anyone holding another unused token T2 of
    the region registers as "h1". Before the fix they got A's id and a new token (A's own
    token then got 401) and their heartbeats received the other tenants' containers."""
    host_id, token = registered
    host = Host.objects.get()
    place(host, alice.tenant, env={"DB_PASSWORD": "alice-secret"})
    place(host, charlie.tenant, env={"API_KEY": "charlie-secret"})
    t2 = new_token(region)
    resp = post(client, "/agent/v1/register", register_body(t2))  # same host name, no proof
    err = assert_error(resp, 409, "host_exists")
    assert host_id not in resp.content.decode() and "host_token" not in resp.content.decode()
    assert "hostname" in err["fields"]
    # Nothing changed: A keeps its token, T2 stays unused (it may still admit a new host).
    host.refresh_from_db()
    assert host.token_hash == hash_token(token) and Host.objects.count() == 1
    assert BootstrapToken.objects.get(token_hash=hash_token(t2)).used_at is None
    # A's own agent keeps working and keeps receiving its desired set.
    desired = post(client, "/agent/v1/heartbeat", beat_body(host_id), token=token)
    assert desired.status_code == 200, desired.content
    assert len(desired.json()["desired"]) == 2
    # The refusal is in the audit log, with the token that tried.
    refused = AuditEvent.objects.get(action="host.register_refused")
    assert refused.object_id == host_id and refused.data["bootstrap"] == t2[:12]
    # T2 still admits a host of its own name, which sees none of A's work.
    other = post(client, "/agent/v1/register", register_body(t2, "h2"))
    assert other.status_code == 200 and other.json()["host_id"] != host_id
    beat = post(
        client, "/agent/v1/heartbeat", beat_body(other.json()["host_id"]),
        token=other.json()["host_token"],
    )
    assert beat.status_code == 200 and beat.json()["desired"] == []
    assert b"secret" not in beat.content


@pytest.mark.parametrize("token", [None, "gph_wrong", "x y z"])
def test_heartbeats_without_a_valid_host_token_get_401(client, registered, token):
    host_id, _ = registered
    resp = post(client, "/agent/v1/heartbeat", beat_body(host_id), token=token)
    assert_error(resp, 401)
    assert resp["WWW-Authenticate"].startswith("Bearer")
    assert Host.objects.get().last_seq == 0


def test_a_token_of_another_host_is_refused(client, region, registered, triggered):
    _, token = registered
    other = post(client, "/agent/v1/register", register_body(new_token(region), "h2")).json()
    assert_error(post(client, "/agent/v1/heartbeat", beat_body(other["host_id"]), token=token), 401)


@pytest.mark.parametrize(
    "raw, code, field",
    [
        (b"{not json", "parse_error", None),
        (b"[]", "validation_error", "$"),
        (
            b'{"protocol_version": 2, "host_id": "h", "seq": 1}',
            "validation_error",
            "protocol_version",
        ),
        (b'{"protocol_version": 1, "host_id": "h", "seq": -1}', "validation_error", "seq"),
        (
            b'{"protocol_version": 1, "host_id": "h", "seq": 1, '
            b'"containers": [{"instance_id": "i", "state": "zombie"}]}',
            "validation_error",
            "containers[0].state",
        ),
    ],
)
def test_malformed_heartbeats_get_400_in_the_error_shape(client, registered, raw, code, field):
    _, token = registered
    err = assert_error(post(client, "/agent/v1/heartbeat", None, token=token, raw=raw), 400, code)
    if field:
        assert list(err["fields"]) == [field]
    assert Host.objects.get().last_seq == 0


def test_a_malformed_registration_gets_400(client, region):
    body = register_body(new_token(region))
    body["cpu_count"] = "many"
    err = assert_error(post(client, "/agent/v1/register", body), 400, "validation_error")
    assert err["fields"] == {"cpu_count": ["must be an integer"]}
    assert BootstrapToken.objects.get().used_at is None


def test_the_agent_api_is_rate_limited_per_host(client, registered, settings):
    settings.AGENT_RATE_LIMIT = "3/min"
    host_id, token = registered
    for seq in (1, 2, 3):
        assert (
            post(client, "/agent/v1/heartbeat", beat_body(host_id, seq), token=token).status_code
            == 200
        )
    resp = post(client, "/agent/v1/heartbeat", beat_body(host_id, 4), token=token)
    assert_error(resp, 429, "throttled")
    assert "Retry-After" in resp


# --- heartbeat details -----------------------------------------------------------------


def test_late_heartbeats_are_not_applied_but_a_restarted_agent_is(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    iid = host_desired_containers(host=Host.objects.get())[0].instance_id
    running = [{"instance_id": iid, "state": "running"}]

    def beat(seq, containers):
        resp = post(client, "/agent/v1/heartbeat", beat_body(host_id, seq, containers), token=token)
        assert resp.status_code == 200, resp.content
        return resp.json()

    beat(5, [])
    answer = beat(4, running)  # late: not applied, but still answered with the desired set
    assert [d["instance_id"] for d in answer["desired"]] == [iid]
    assert state(w) == State.SCHEDULED and Host.objects.get().last_seq == 5
    beat(1, running)  # seq 1: the agent restarted
    assert state(w) == State.RUNNING and Host.objects.get().last_seq == 1


def test_containers_null_infers_nothing(client, registered, alice):
    host_id, token = registered
    w = place(Host.objects.get(), alice.tenant)
    workload_transition(workload=w, to=State.RUNNING)
    workload_stop(workload=w)
    resp = post(client, "/agent/v1/heartbeat", beat_body(host_id, containers=None), token=token)
    assert resp.status_code == 200
    assert state(w) == State.STOPPING  # not "gone": the agent could not look
    post(client, "/agent/v1/heartbeat", beat_body(host_id, 2, containers=[]), token=token)
    assert state(w) == State.STOPPED


def test_samples_update_health_and_idleness(client, registered):
    host_id, token = registered
    gpus = [
        {"uuid": "GPU-h1-0", "gpu_util": 97.0, "mem_used_mib": 70000},
        {"uuid": "GPU-h1-1", "healthy": False, "error": "GPU is lost"},
        {"uuid": "GPU-elsewhere", "gpu_util": 1.0},
    ]
    post(client, "/agent/v1/heartbeat", beat_body(host_id, gpus=gpus), token=token)
    fastpath.heartbeats_flush()  # no-op here: a GPU failed, so the slow path wrote its samples
    g0, g1 = Gpu.objects.order_by("index")
    assert (g0.utilisation, g0.memory_used_mib, g0.idle_since, g0.healthy) == (
        0.97,
        70000,
        None,
        True,
    )
    assert g1.healthy is False and g1.sampled_at is not None
    gpus[0]["gpu_util"] = 2.0
    post(client, "/agent/v1/heartbeat", beat_body(host_id, 2, gpus=gpus[:1]), token=token)
    fastpath.heartbeats_flush()  # buffered (the slow path's too, where no GPU's health moved)
    g0.refresh_from_db()
    first_idle = g0.idle_since
    assert g0.utilisation == 0.02 and first_idle is not None
    post(client, "/agent/v1/heartbeat", beat_body(host_id, 3, gpus=gpus[:1]), token=token)
    fastpath.heartbeats_flush()
    g0.refresh_from_db()
    assert g0.idle_since == first_idle  # idle *since*: the first idle sample counts


def test_the_desired_set_costs_one_query_however_many_workloads(
    registered, alice, django_assert_num_queries
):
    host = Host.objects.get()
    place(host, alice.tenant)
    place(host, alice.tenant, kind="job")
    with django_assert_num_queries(1):
        desired = host_desired_containers(host=host)
    assert len(desired) == 2


def test_each_attempt_of_a_job_gets_its_own_container_id(registered, alice):
    host = Host.objects.get()
    w = place(host, alice.tenant, kind="job", max_retries=1)
    [first] = host_desired_containers(host=host)
    workload_requeue_or_end(workload=w, ended=State.FAILED, reason="container exited with code 1")
    assert state(w) == State.PENDING and host_desired_containers(host=host) == []
    allocate(host, w)  # placed again, on the same GPU
    [second] = host_desired_containers(host=host)
    assert first.gpu_uuids == second.gpu_uuids and first.instance_id != second.instance_id
    assert first.instance_id.startswith(f"{w.pk}.") and second.instance_id.startswith(f"{w.pk}.")
    assert second.pids_limit == dj_settings.AGENT_PIDS_LIMIT == 4096


def test_re_registering_cannot_shrink_below_bookings_and_revives_a_down_host(
    client, region, registered
):
    host_id, token = registered
    Host.objects.update(used_vcpus=48, state=HostState.DOWN, down_since=timezone.now())
    smaller = register_body(new_token(region))
    smaller["cpu_count"] = 32
    smaller["previous_host_token"] = token  # the proof that it is this host
    assert_error(post(client, "/agent/v1/register", smaller), 409, "host_shrunk")
    host = Host.objects.get()
    assert (host.vcpus, host.token_hash, host.state) == (64, hash_token(token), HostState.DOWN)
    assert BootstrapToken.objects.filter(used_at__isnull=True).count() == 1  # not spent
    fewer = {**register_body(new_token(region), gpus=1), "previous_host_token": token}
    resp = post(client, "/agent/v1/register", fewer)
    assert resp.status_code == 200 and resp.json()["host_id"] == host_id
    host.refresh_from_db()
    assert (host.state, host.down_since, host.used_vcpus) == (HostState.READY, None, 48)
    # The GPU the inventory no longer lists is kept, unhealthy, out of the way.
    gone = Gpu.objects.get(uuid="GPU-h1-1")
    assert (gone.healthy, gone.index) == (False, 10000)


@pytest.mark.parametrize("bulk_path", [True, False], ids=["running-seen", "ran-between-heartbeats"])
def test_the_recorded_run_time_is_the_one_the_agent_observed(make_sim_host, alice, triggered, bulk_path):
    """A job set to run 20 s shows 20 s, not the span between the heartbeats that saw it
    start and end; a host clock outside [queued, now] is not trusted (the fake clock above)."""
    import time as _time
    from datetime import timedelta

    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, alice.tenant, kind="job", it_code="h100.2x", env={"GPUCLOUD_SIM_DURATION_S": "20"})
    Workload.objects.filter(pk=w.pk).update(queued_at=timezone.now() - timedelta(seconds=120))
    sim.clock.t = _time.time() - 60  # the host's clock: the job started a minute ago, ended 40 s ago
    sim.beat()  # starts the container (at the host's clock)
    if bulk_path:
        sim.beat()  # reports it running
        assert state(w) == State.RUNNING
    sim.clock.advance(20)
    sim.beat()
    w.refresh_from_db()
    assert w.state == State.SUCCEEDED
    assert (w.ended_at - w.started_at).total_seconds() == pytest.approx(20, abs=0.01)
    assert w.ended_at <= timezone.now()


def test_a_host_clock_in_the_future_is_not_trusted_for_run_time(make_sim_host, alice, triggered):
    import time as _time

    sim = make_sim_host()
    sim.beat()
    w = place(sim.host, alice.tenant, kind="job", it_code="h100.2x", env={"GPUCLOUD_SIM_DURATION_S": "20"})
    sim.clock.t = _time.time() + 3600
    sim.beat()
    sim.clock.advance(21)
    sim.beat()
    w.refresh_from_db()
    assert w.state == State.SUCCEEDED and w.ended_at <= timezone.now()
    assert (w.ended_at - w.started_at).total_seconds() < 20  # the control plane's own times
