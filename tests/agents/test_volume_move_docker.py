"""Moving a volume between two hosts through their agents, on a real Docker engine: a job on
host A writes a file; a move whose data arrives corrupted fails and leaves the volume on A,
usable; a clean move puts it on host B (checked size and SHA-256), A's copy is removed, and
a job pinned to B reads the file. Attaching a moving volume is refused (409 volume_moving).

Both agents are real (the docker runtime, the locally built busybox image as the helper that
reads and writes a volume through the engine's archive API) and share one engine under two
scopes, so each has its own copy of the volume (`DockerRuntime.engine_volume`)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import docker
import pytest
from test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from test_e2e_docker import (  # noqa: F401 - fixtures, used by name
    IMAGE,
    SCOPE,
    egress_rules,
    engine,
    launch,
    schedule,
    start_agent,
    state,
    tenant_networks,
    us_east,
)

from agents.host.config import AgentConfig
from agents.host.docker import LABEL_AGENT
from agents.services.registration import bootstrap_token_create
from scheduler.choices import State
from volumes import moves
from volumes.models import Volume, VolumeMove, VolumeMoveChunk

SCOPE_B = f"{SCOPE}-b"


@pytest.fixture
def scoped(engine) -> Iterator[None]:
    yield
    for scope in (SCOPE, SCOPE_B):
        for c in engine.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={scope}"}):
            c.remove(force=True)
        for v in engine.volumes.list(filters={"label": f"{LABEL_AGENT}={scope}"}):
            v.remove(force=True)


def make_host(live_server, region, tmp_path, scope: str):
    cfg = AgentConfig(
        server=live_server.url, bootstrap_token=bootstrap_token_create(region=region)[1],
        gpu_backend="sim", runtime="docker", docker_scope=scope, docker_image_fallback=IMAGE,
        sim_gpus=4, sim_model="L40S", state_dir=tmp_path / scope, hostname=f"docker-{scope}",
    ).validated()
    h = start_agent(cfg)
    h.beat()
    return h


def run_to_end(engine, h, w, scope: str) -> None:
    deadline, beat_at = time.monotonic() + 60, 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= beat_at:  # a heartbeat a second at most (the agents' rate limit)
            h.beat()
            beat_at = time.monotonic() + 1.0
        ctrs = engine.containers.list(all=True, filters={"label": [f"{LABEL_AGENT}={scope}",
                                                                    f"gpucloud.workload={w.pk}"]})
        if ctrs and all(c.status == "exited" for c in ctrs):
            h.beat(2)  # its exit and its final log tail
            return
        time.sleep(0.2)
    pytest.fail(f"{w.name} did not run to its end")


def join_moves(h) -> None:
    for t in list(h.agent.moves.values()):
        t.join(timeout=30)
        assert not t.is_alive()


def test_a_volume_moves_between_hosts_through_the_agents(
    live_server, us_east, engine, alice, tenant_networks, egress_rules, scoped, tmp_path, triggered
):
    api = alice.client()
    a = make_host(live_server, us_east, tmp_path, SCOPE)
    vol = api.post("/api/v1/volumes", {"name": "data", "region": "us-east-1", "size_gib": 1}, format="json").json()
    mount = [{"volume": vol["id"], "mount_path": "/workspace"}]
    writer = launch(alice, "jobs", name="writer", volumes=mount,
                    command=["sh", "-c", "mkdir -p /workspace/d && echo moved-with-its-volume > /workspace/d/note.txt"])
    schedule(us_east)
    run_to_end(engine, a, writer, SCOPE)
    assert state(writer) == State.SUCCEEDED
    volume = Volume.objects.get(pk=vol["id"])
    assert volume.host == a.host
    b = make_host(live_server, us_east, tmp_path, SCOPE_B)
    in_b = f"{volume.docker_name}.{SCOPE_B}"

    # 1. a move whose data is spoilt on the way fails; the volume stays on A, usable
    move = moves.move_start(volume=volume, target=b.host)
    r = api.post("/api/v1/jobs", {"name": "early", "instance_type": "l40s.2x-tiny", "region": "us-east-1",
                                  "image": IMAGE, "volumes": mount}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "volume_moving", r.content
    b.beat()
    assert not b.agent.moves  # nothing to receive before everything was sent
    a.beat()  # the send order
    join_moves(a)
    move.refresh_from_db()
    assert move.state == VolumeMove.SENT and move.size_bytes > 0 and move.chunks >= 1
    chunk = VolumeMoveChunk.objects.get(move=move, seq=0)
    chunk.data = bytes(chunk.data)[:-1] + bytes([bytes(chunk.data)[-1] ^ 1])
    chunk.save()
    b.beat()  # the receive order
    join_moves(b)
    move.refresh_from_db()
    assert move.state == VolumeMove.FAILED and "sha256" in move.error
    assert Volume.objects.get(pk=volume.pk).host == a.host
    assert not VolumeMoveChunk.objects.filter(move=move).exists()
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(in_b)  # the target removed the copy it was not allowed to keep
    assert api.get(f"/api/v1/volumes/{volume.pk}").json()["host"] == a.host.name

    # 2. a clean move: B gets the data, the volume lives there, A's copy goes
    move = moves.move_start(volume=volume, target=b.host)
    a.beat()
    join_moves(a)
    b.beat()
    join_moves(b)
    move.refresh_from_db()
    assert move.state == VolumeMove.DONE, move.error
    assert Volume.objects.get(pk=volume.pk).host == b.host
    assert engine.volumes.get(in_b) is not None
    a.beat()  # told to remove its copy
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(f"{volume.docker_name}.{SCOPE}")
    a.agent._volumes_measured_at = float("-inf")
    a.beat()  # its report without the volume
    move.refresh_from_db()
    assert move.source_removed_at is not None

    # 3. the next job with the volume is pinned to B and reads the file there
    reader = launch(alice, "jobs", name="reader", volumes=mount, command=["sh", "-c", "cat /workspace/d/note.txt"])
    assert reader.pinned_host == b.host
    schedule(us_east)
    run_to_end(engine, b, reader, SCOPE_B)
    assert state(reader) == State.SUCCEEDED
    assert "moved-with-its-volume" in api.get(f"/api/v1/jobs/{reader.pk}/logs").json()["text"]
    assert volume.size_gib == Volume.objects.get(pk=volume.pk).size_gib  # a move changes no size, no quota
