"""The agent loop against a tiny fake control plane over real HTTP on 127.0.0.1.

The fake is the far side of the HTTP boundary; end-to-end tests against the real Django
endpoints live with the control plane.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agents.host import __main__ as agent_main
from agents.host.config import AgentConfig
from agents.host.daemon import Agent, backoff
from agents.host.sim import LABEL_SIM_DURATION, LABEL_SIM_EXIT_CODE, SimGpuBackend, SimRuntime
from agents.host.state import HostState, load_state
from agents.protocol import (
    DesiredContainer,
    Heartbeat,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    WaitRequest,
    WaitResponse,
)


@dataclass
class ControlPlane:
    """Records what agents send; answers with ``desired`` (or with queued failures)."""

    bootstrap_token: str = "boot-1"
    interval_s: float = 0.01
    desired: list[DesiredContainer] = field(default_factory=list)
    fail_next: list[int] = field(default_factory=list)  # HTTP statuses to answer first
    rotate_to: str | None = None
    registrations: list[RegisterRequest] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)

    def handle(self, path: str, auth: str, body: Any) -> tuple[int, dict[str, Any]]:
        if self.fail_next:
            code = self.fail_next.pop(0)
            return code, {"error": {"code": "unavailable", "message": "try later", "fields": {}}}
        if path == "/agent/v1/register":
            req = RegisterRequest.from_dict(body)
            if req.bootstrap_token != self.bootstrap_token:
                return 401, {"error": {"code": "bad_token", "message": "no", "fields": {}}}
            self.bootstrap_token = ""  # one-time
            self.registrations.append(req)
            token = f"host-token-{len(self.registrations)}"
            self.tokens.add(token)
            return 200, RegisterResponse(
                f"host-{len(self.registrations)}", token, self.interval_s
            ).to_dict()
        if path == "/agent/v1/heartbeat":
            self.auth_headers.append(auth)
            if auth.removeprefix("Bearer ") not in self.tokens:
                return 401, {"error": {"code": "bad_token", "message": "no", "fields": {}}}
            self.heartbeats.append(Heartbeat.from_dict(body))
            token = self.rotate_to
            if token:
                self.tokens = {token}
                self.rotate_to = None
            return 200, HeartbeatResponse(list(self.desired), self.interval_s, token).to_dict()
        return 404, {"error": {"code": "not_found", "message": path, "fields": {}}}


@pytest.fixture
def plane() -> Iterator[tuple[ControlPlane, str]]:
    cp = ControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, reply = cp.handle(self.path, self.headers.get("Authorization", ""), body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield cp, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def make_agent(url: str, state_dir: Path, clock: Clock | None = None, **cfg: Any) -> Agent:
    config = AgentConfig(
        server=url,
        bootstrap_token="boot-1",
        gpu_backend="sim",
        runtime="sim",
        state_dir=state_dir,
        hostname="sim-1",
        request_timeout_s=2.0,
        backoff_base_s=1.0,
        backoff_cap_s=30.0,
    )
    config = replace(config, **cfg)
    runtime = SimRuntime(clock=clock or Clock(), seed=1)
    backend = SimGpuBackend(model="H100", count=4, hostname="sim-1", runtime=runtime)
    return Agent(
        config, backend=backend, runtime=runtime, rng=random.Random(0), resources=(112, 1048576)
    )


def job(iid: str, gpus: list[str], **labels: str) -> DesiredContainer:
    return DesiredContainer(
        instance_id=iid,
        tenant_id="t1",
        kind="job",
        image="pytorch",
        gpu_uuids=gpus,
        network="gpucloud-t1",
        labels=labels,
    )


# --- backoff ------------------------------------------------------------------------------


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    rng = random.Random(42)
    for attempt in range(12):
        ceiling = min(60.0, 1.0 * 2**attempt)
        for _ in range(50):
            d = backoff(attempt, 1.0, 60.0, rng)
            assert ceiling / 2 <= d <= ceiling
    assert backoff(10_000, 1.0, 60.0, rng) <= 60.0  # no overflow on long outages


def test_backoff_is_deterministic_for_a_seed_and_spreads_a_fleet() -> None:
    assert backoff(3, 1.0, 60.0, random.Random(1)) == backoff(3, 1.0, 60.0, random.Random(1))
    fleet = {round(backoff(3, 1.0, 60.0, random.Random(seed)), 3) for seed in range(20)}
    assert len(fleet) > 15


# --- the loop -----------------------------------------------------------------------------


def test_register_heartbeat_start_then_remove_when_no_longer_desired(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    uuids = agent.backend.inventory()
    assert agent.iterate() == cp.interval_s

    (reg,) = cp.registrations
    assert (reg.hostname, reg.gpu_backend, reg.runtime, reg.cpu_count) == (
        "sim-1",
        "sim",
        "sim",
        112,
    )
    assert [g.uuid for g in reg.gpus] == [g.uuid for g in uuids]
    assert cp.auth_headers == ["Bearer host-token-1"]
    assert len(cp.heartbeats[0].gpus) == 4

    cp.desired = [job("j1", [uuids[0].uuid, uuids[1].uuid])]
    agent.iterate()  # heartbeat -> desired -> Start
    running = agent.runtime.list()
    assert [(o.instance_id, o.state) for o in running] == [("j1", "running")]

    agent.iterate()  # the next heartbeat reports it running, and its GPUs busy
    hb = cp.heartbeats[-1]
    assert hb.containers is not None
    assert [(c.instance_id, c.state) for c in hb.containers] == [("j1", "running")]
    util = {s.uuid: s.gpu_util for s in hb.gpus}
    assert (util[uuids[0].uuid] or 0) > 40 and (util[uuids[3].uuid] or 0) < 1

    cp.desired = []
    agent.iterate()  # no longer desired -> stopped within one interval
    assert [o.state for o in agent.runtime.list()] == ["exited"]
    agent.iterate()  # its exit reported once, then removed
    assert [(c.instance_id, c.state, c.exit_code) for c in cp.heartbeats[-1].containers or []] == [
        ("j1", "exited", 143)
    ]
    assert agent.runtime.list() == []
    assert [h.seq for h in cp.heartbeats] == [1, 2, 3, 4, 5]


def test_job_exit_code_is_reported_and_the_job_is_not_restarted(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    clock = Clock()
    agent = make_agent(url, tmp_path, clock)
    cp.desired = [job("j", [], **{LABEL_SIM_DURATION: "30", LABEL_SIM_EXIT_CODE: "2"})]
    agent.iterate()
    clock.now += 31
    agent.iterate()
    agent.iterate()
    reports = [c for h in cp.heartbeats for c in h.containers or []]
    assert reports[-1].state == "exited" and reports[-1].exit_code == 2
    assert [c for c in agent.runtime.calls if c[0] == "run"] == [("run", "j")]  # started once


def test_desired_container_that_cannot_start_is_reported_missing_with_the_error(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    agent.runtime = SimRuntime(fail_images=frozenset({"nope"}))
    cp.desired = [replace(job("j", []), image="nope")]
    agent.iterate()
    agent.iterate()
    (c,) = cp.heartbeats[-1].containers or []
    assert c.state == "missing" and c.error is not None and "pull access denied" in c.error


def test_restart_reuses_the_saved_host_token_instead_of_registering(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    make_agent(url, tmp_path).iterate()
    state = load_state(tmp_path, url)
    assert state is not None and state.host_token == "host-token-1"
    assert (tmp_path / "host.json").stat().st_mode & 0o777 == 0o600

    again = make_agent(url, tmp_path, bootstrap_token="")
    again.iterate()
    assert len(cp.registrations) == 1
    assert cp.auth_headers[-1] == "Bearer host-token-1"
    assert again.last_ok


def test_rotated_host_token_is_saved_and_used(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    agent.iterate()
    cp.rotate_to = "rotated"
    agent.iterate()
    agent.iterate()
    assert cp.auth_headers[-1] == "Bearer rotated"
    assert (load_state(tmp_path, url) or pytest.fail()).host_token == "rotated"


def test_refused_host_token_triggers_a_new_registration(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    agent.iterate()
    cp.tokens.clear()  # an operator deleted the host
    cp.bootstrap_token = "boot-1"
    agent.iterate()  # 401 -> token dropped
    assert agent.state is None and load_state(tmp_path, url) is None
    agent.iterate()
    assert len(cp.registrations) == 2 and agent.last_ok
    # The second registration carries the token it held: its proof of being that host.
    assert [r.previous_host_token for r in cp.registrations] == [None, "host-token-1"]


def test_503_backs_off_keeps_containers_running_then_recovers(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    cp.desired = [job("keep", [])]
    agent.iterate()
    assert [o.state for o in agent.runtime.list()] == ["running"]

    cp.desired = []  # the control plane changes its mind but cannot be reached
    cp.fail_next = [503, 503, 503]
    delays = [agent.iterate() for _ in range(3)]
    assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2 and 2 <= delays[2] <= 4
    assert [o.state for o in agent.runtime.list()] == ["running"]  # nothing stopped blind

    assert agent.iterate() == cp.interval_s
    assert agent.failures == 0
    assert [o.state for o in agent.runtime.list()] == ["exited"]  # now stopped


def test_connection_refused_backs_off_and_never_raises(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = make_agent(f"http://127.0.0.1:{port}", tmp_path)
    delays = [agent.iterate() for _ in range(8)]
    assert delays[0] <= 1 and delays[-1] >= 15 and max(delays) <= 30
    assert not agent.last_ok and agent.state is None


def test_failing_gpu_backend_and_runtime_do_not_kill_the_loop(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    agent.iterate()

    def boom() -> list[Any]:
        raise OSError("driver wedged")

    agent.backend.sample = boom  # type: ignore[method-assign]
    agent.runtime.list = boom  # type: ignore[method-assign]
    assert agent.iterate() == cp.interval_s
    hb = cp.heartbeats[-1]
    assert hb.gpus == [] and hb.containers is None  # "unknown", not "none running"


def test_run_exits_zero_on_stop_request_and_leaves_containers_running(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    cp.desired = [job("long", [])]
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(agent.run()))
    t.start()
    for _ in range(500):
        if len(cp.heartbeats) >= 3:
            break
        threading.Event().wait(0.01)
    agent.request_stop()
    t.join(timeout=5)
    assert result == [0]
    assert [o.state for o in agent.runtime.list()] == ["running"]


def test_main_once_with_sim_backend(
    plane: tuple[ControlPlane, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp, url = plane
    monkeypatch.setattr(agent_main, "setup_logging", lambda level: None)  # keep pytest's handlers
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    monkeypatch.setenv("GPUCLOUD_BOOTSTRAP_TOKEN", "boot-1")
    monkeypatch.setenv("GPUCLOUD_SIM_MODEL", "MI300X")
    try:
        rc = agent_main.main(
            ["--server", url, "--gpu-backend", "sim", "--runtime", "sim", "--sim-gpus", "2",
             "--state-dir", str(tmp_path), "--hostname", "m1", "--once"]
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert rc == 0
    (reg,) = cp.registrations
    assert [g.model for g in reg.gpus] == ["AMD Instinct MI300X"] * 2
    assert len(cp.heartbeats) == 1


def test_main_once_returns_nonzero_when_the_control_plane_is_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_main, "setup_logging", lambda level: None)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        rc = agent_main.main(
            ["--server", f"http://127.0.0.1:{port}", "--bootstrap-token", "x",
             "--gpu-backend", "sim", "--runtime", "sim", "--state-dir", str(tmp_path), "--once"]
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert rc == 1


def test_main_refuses_bad_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_main.main(["--server", "ftp://x"]) == 2
    assert "GPUCLOUD_SERVER" in capsys.readouterr().err


# --- the long poll ------------------------------------------------------------------------


class PollClient:
    """A control plane whose long polls the test answers, one at a time."""

    def __init__(self) -> None:
        self.polled: queue.Queue[str] = queue.Queue()
        self.answers: queue.Queue[WaitResponse] = queue.Queue()

    def wait(self, token: str, req: WaitRequest) -> WaitResponse:
        self.polled.put(req.version)
        return self.answers.get(timeout=10)


def test_a_poll_woken_by_the_hosts_own_report_does_not_heartbeat_again(tmp_path: Path) -> None:
    """The change that ends a poll is most often the host's own report, whose answer (read
    after it) came while the poll waited, or is in flight: no second heartbeat for it, and the
    next poll is for the newer version. A change nobody answered yet still wakes the agent."""
    agent = make_agent("http://127.0.0.1:9", tmp_path)
    client = PollClient()
    agent.client = client  # type: ignore[assignment]
    agent.state = HostState("http://127.0.0.1:9", "h-1", "tok")
    threading.Thread(target=agent._poll_loop, daemon=True).start()
    try:
        agent._answered("1")
        assert client.polled.get(timeout=10) == "1"
        agent._answered("2")  # the host's own report moved the version, and was answered
        client.answers.put(WaitResponse(changed=True))
        assert client.polled.get(timeout=10) == "2"
        assert not agent._wake.is_set()

        decided: queue.Queue[bool] = queue.Queue()
        coming = agent._answer_coming

        def spy(version: str) -> bool:
            got = coming(version)
            decided.put(got)
            return got

        agent._answer_coming = spy  # type: ignore[method-assign]
        agent._beating = True  # the report's answer is on its way: it starts the next poll
        client.answers.put(WaitResponse(changed=True))
        assert decided.get(timeout=10) is True
        agent._beating = False
        agent._answered("3")
        assert client.polled.get(timeout=10) == "3"
        assert not agent._wake.is_set()

        client.answers.put(WaitResponse(changed=True))  # a placement: nobody answered it yet
        assert agent._wake.wait(timeout=10)
    finally:
        agent.request_stop()
        client.answers.put(WaitResponse(changed=False))


def test_a_start_that_fails_the_same_way_is_retried_after_a_backoff_then_given_up(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    clock = Clock()
    agent = make_agent(url, tmp_path)
    agent.runtime = SimRuntime(fail_images=frozenset({"nope"}))
    agent.clock = clock
    cp.desired = [replace(job("j", []), image="nope")]

    def reported() -> tuple[str, int, str | None]:
        (c,) = cp.heartbeats[-1].containers or []
        return c.state, c.start_attempts, c.error

    agent.iterate()  # the first start fails
    agent.iterate()
    assert reported() == ("missing", 1, "pull access denied for nope")
    agent.iterate()  # within the backoff (1 s base): not tried again
    assert [c for c in agent.runtime.calls if c[0] == "run"] == [("run", "j")]
    for _ in range(5):  # past each backoff: tried again, up to the bound (3, the answer's)
        clock.now += 60
        agent.iterate()
    assert reported() == ("missing", 3, "pull access denied for nope")
    assert [c for c in agent.runtime.calls if c[0] == "run"] == [("run", "j")] * 3  # then given up
    clock.now += 3600
    agent.iterate()
    assert len([c for c in agent.runtime.calls if c[0] == "run"]) == 3


def test_a_container_gone_without_the_agents_order_is_reported_with_what_it_saw(
    plane: tuple[ControlPlane, str], tmp_path: Path
) -> None:
    cp, url = plane
    agent = make_agent(url, tmp_path)
    cp.desired = [job("j", [])]
    agent.iterate()  # started
    agent.iterate()  # seen running
    (c,) = cp.heartbeats[-1].containers or []
    assert c.state == "running" and c.note is None
    cid = c.container_id or ""
    assert isinstance(agent.runtime, SimRuntime)
    agent.runtime.vanish("j")  # docker rm -f behind the agent's back
    agent.iterate()
    (c,) = cp.heartbeats[-1].containers or []
    assert c.state == "missing" and c.error is None
    assert c.note is not None and cid[:12] in c.note and "the agent did not remove it" in c.note
    # its own removal is not a loss: no note once the control plane no longer wants it
    agent.iterate()  # (still desired here: started again, the note said once)
    cp.desired = []
    agent.iterate()
    agent.iterate()
    agent.iterate()
    assert all(c.note is None for c in cp.heartbeats[-1].containers or [])
