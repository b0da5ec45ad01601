"""Log tails over the heartbeat (protocol and agent), and the docker runtime's GPU modes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.host.config import AgentConfig, ConfigError, docker_gpu_mode, parse_args
from agents.host.docker import LABEL_AGENT, DockerRuntime
from agents.host.sim import SimRuntime
from agents.protocol import (
    LOG_TAIL_MAX_CHARS,
    ContainerLogTail,
    DesiredContainer,
    Heartbeat,
    HeartbeatResponse,
    LogsRequest,
    ProtocolError,
    clip_log,
    json_size,
)

SPEC = DesiredContainer(
    instance_id="i-1", tenant_id="t-1", kind="instance", image="busybox",
    gpu_uuids=["GPU-a", "GPU-b"], gpu_milli=1000, vcpus=2, memory_mib=4096,
)


def test_logs_fields_round_trip_and_are_optional() -> None:
    hb = Heartbeat("h", 3, logs=[ContainerLogTail("i-1", "a\nb", False)])
    assert Heartbeat.from_dict(hb.to_dict()) == hb
    resp = HeartbeatResponse([], 5.0, logs_requests=[LogsRequest("i-1", 20)])
    assert HeartbeatResponse.from_dict(resp.to_dict()) == resp
    # An older peer sends neither field: both default to empty.
    old = {"protocol_version": 1, "desired": [], "heartbeat_interval_s": 5}
    assert HeartbeatResponse.from_dict(old).logs_requests == []
    assert Heartbeat.from_dict({"protocol_version": 1, "host_id": "h", "seq": 1}).logs == []


@pytest.mark.parametrize(
    "body, field",
    [
        ({"instance_id": "i", "tail": 0}, "logs_requests[0].tail"),
        ({"instance_id": "i", "tail": 10_001}, "logs_requests[0].tail"),
        ({"tail": 5}, "logs_requests[0].instance_id"),
    ],
)
def test_bad_logs_requests_name_the_field(body: dict[str, Any], field: str) -> None:
    data = {"protocol_version": 1, "desired": [], "heartbeat_interval_s": 5,
            "logs_requests": [body]}
    with pytest.raises(ProtocolError) as e:
        HeartbeatResponse.from_dict(data)
    assert e.value.field == field


def test_a_log_tail_is_clipped_to_its_newest_part() -> None:
    text, cut = clip_log("x" * 10 + "y" * LOG_TAIL_MAX_CHARS)
    assert cut and text == "y" * LOG_TAIL_MAX_CHARS
    assert clip_log("short") == ("short", False)


@pytest.mark.parametrize("char", ["x", "\u2588", "\x01", "\U0001f600", '"', "\\"])
def test_a_log_tail_is_clipped_to_a_json_byte_budget(char: str) -> None:
    """The budget counts JSON bytes, not characters: escapes take up to 12 bytes a character."""
    text = "first line\n" + char * 5000
    clipped, cut = clip_log(text, max_bytes=1000)
    assert cut and json_size(clipped) <= 1000 and text.endswith(clipped)
    assert json_size(text[-len(clipped) - 1 :]) > 1000  # the longest newest part that fits
    assert clip_log(text, max_bytes=10**6) == (text, False)


@contextlib.contextmanager
def serve(cp: Any) -> Iterator[str]:
    """The fake control plane ``cp`` over HTTP on 127.0.0.1; yields its URL."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
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
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def log_plane(tail: int, refuse_text: bool = False) -> Any:
    """The fake control plane, asking for a tail of i-1 in its second heartbeat answer;
    with ``refuse_text``, it refuses (400) every heartbeat that carries log text."""
    from test_host_daemon import ControlPlane

    class Plane(ControlPlane):
        refused = 0

        def handle(self, path: str, auth: str, body: Any):
            heartbeat = path.endswith("heartbeat")
            if heartbeat and refuse_text and any(t.get("text") for t in body.get("logs", [])):
                self.refused += 1
                return 400, {"error": {"code": "invalid", "message": "logs[0].text", "fields": {}}}
            status, reply = super().handle(path, auth, body)
            if heartbeat and status == 200 and len(self.heartbeats) == 2:
                reply["logs_requests"] = [{"instance_id": "i-1", "tail": tail}]
            return status, reply

    return Plane(desired=[SPEC])


def test_the_agent_answers_log_requests_in_its_next_heartbeat(tmp_path: Path) -> None:
    from test_host_daemon import make_agent

    cp = log_plane(tail=1)
    with serve(cp) as url:
        agent = make_agent(url, tmp_path)
        for _ in range(3):
            agent.iterate()
        assert [hb.logs for hb in cp.heartbeats[:2]] == [[], []]
        (tail,) = cp.heartbeats[2].logs
        assert tail.instance_id == "i-1" and tail.text.startswith("started busybox")
        agent.iterate()
        assert cp.heartbeats[3].logs == []  # answered once


def test_a_log_tail_the_control_plane_refuses_is_sent_empty_not_forever(tmp_path: Path) -> None:
    """A heartbeat refused for its content would be refused again on every retry and the
    host go DOWN: the next heartbeat sends the refused tails empty (as "no such container")."""
    from test_host_daemon import make_agent

    cp = log_plane(tail=5, refuse_text=True)
    with serve(cp) as url:
        agent = make_agent(url, tmp_path)
        for _ in range(5):
            agent.iterate()
        assert cp.refused == 1 and agent.last_ok
        assert [hb.logs for hb in cp.heartbeats[2:]] == [[ContainerLogTail("i-1", "", False)], []]


@pytest.mark.parametrize(
    "backend, mode, expected",
    [("nvml", "auto", "nvidia"), ("amdsmi", "auto", "amd"), ("sim", "auto", "none"),
     ("sim", "nvidia", "nvidia"), ("nvml", "none", "none")],
)
def test_the_docker_gpu_mode_follows_the_backend_unless_set(backend, mode, expected) -> None:
    cfg = AgentConfig(server="http://x", gpu_backend=backend, docker_gpu_mode=mode)
    assert docker_gpu_mode(cfg) == expected


def test_the_gpu_mode_and_scope_are_flags_and_variables() -> None:
    cfg = parse_args(["--server", "http://x", "--docker-gpu-mode", "none"],
                     {"GPUCLOUD_DOCKER_SCOPE": "ci-1"})
    assert (cfg.docker_gpu_mode, cfg.docker_scope) == ("none", "ci-1")
    with pytest.raises(ConfigError):
        AgentConfig(server="http://x", docker_gpu_mode="intel").validated()


def test_gpu_mode_none_sets_the_variables_but_requests_no_device() -> None:
    k = DockerRuntime(client=object(), gpu_vendor="none").run_kwargs(SPEC)
    assert "device_requests" not in k and "devices" not in k
    assert k["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert k["environment"]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert LABEL_AGENT not in k["labels"]
    scoped = DockerRuntime(client=object(), gpu_vendor="none", scope="ci-1").run_kwargs(SPEC)
    assert scoped["labels"][LABEL_AGENT] == "ci-1"
    with pytest.raises(ValueError):
        DockerRuntime(client=object(), gpu_vendor="intel")


def test_the_sim_runtime_logs_are_what_the_agent_sends() -> None:
    rt = SimRuntime()
    rt.run(SPEC)
    assert rt.logs("i-1", tail=1) == "started busybox"
