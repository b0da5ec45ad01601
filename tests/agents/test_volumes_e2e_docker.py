"""Acceptance for volumes on a real Docker engine: a job writes a file to a volume, the next
job with the same volume (placed on the same host: the volume lives there) reads it back, the
volume outlives both, deleting it while attached is refused, the agent measures it, and once
deleted and purged the agent removes its data.

Same harness as test_e2e_docker.py (the live server, the real scheduler cycle, the real agent
with the docker runtime and the locally built busybox image).
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest
from test_agent_api import triggered  # noqa: F401 - a fixture, used by name
from test_e2e_docker import (  # noqa: F401 - fixtures, used by name
    SCOPE,
    docker_host,
    egress_rules,
    engine,
    launch,
    schedule,
    state,
    tenant_networks,
    us_east,
    wait_exited,
)

from agents.host.docker import LABEL_AGENT
from scheduler.choices import State
from volumes.models import Volume
from volumes.services import purge_due


@pytest.fixture
def scoped_volumes(engine) -> Iterator[None]:
    yield
    for v in engine.volumes.list(filters={"label": f"{LABEL_AGENT}={SCOPE}"}):
        v.remove(force=True)


def test_a_volume_keeps_one_jobs_file_for_the_next_and_outlives_both(
    docker_host, us_east, engine, alice, tenant_networks, scoped_volumes, settings
):
    api = alice.client()
    r = api.post("/api/v1/volumes", {"name": "data", "region": "us-east-1", "size_gib": 1}, format="json")
    assert r.status_code == 201, r.content
    vol = r.json()
    assert (vol["state"], vol["host"]) == ("available", None)
    mount = [{"volume": vol["id"], "mount_path": "/workspace"}]
    writer = launch(alice, "jobs", name="writer", volumes=mount,
                    command=["sh", "-c", "echo written-by-job-1 > /workspace/note.txt"])
    # one writer at a time: a second launch with it, and deleting it, are refused while attached
    r = api.post("/api/v1/jobs", {"name": "second", "instance_type": "l40s.2x-tiny", "region": "us-east-1",
                                  "image": writer.image, "volumes": mount}, format="json")
    assert r.status_code == 409 and r.json()["error"]["code"] == "volume_attached", r.content
    r = api.delete(f"/api/v1/volumes/{vol['id']}")
    assert r.status_code == 409 and r.json()["error"]["code"] == "volume_attached", r.content
    assert api.get(f"/api/v1/volumes/{vol['id']}").json()["attached_to"]["name"] == "writer"

    schedule(us_east)
    host = docker_host.host
    assert Volume.objects.get(pk=vol["id"]).host == host  # it lives where its first user runs
    docker_host.beat()
    wait_exited(engine, writer)
    docker_host.beat()
    assert state(writer) == State.SUCCEEDED and writer.exit_code == 0
    name = f"{Volume.objects.get(pk=vol['id']).docker_name}.{SCOPE}"  # the engine's name: one copy per agent
    assert engine.volumes.get(name).attrs["Labels"][LABEL_AGENT] == SCOPE

    reader = launch(alice, "jobs", name="reader", volumes=mount, command=["sh", "-c", "cat /workspace/note.txt"])
    assert reader.pinned_host == host  # host affinity: the core may place it nowhere else
    schedule(us_east)
    docker_host.beat()
    wait_exited(engine, reader)
    docker_host.beat(2)  # its exit and its final log tail
    assert state(reader) == State.SUCCEEDED
    assert "written-by-job-1" in api.get(f"/api/v1/jobs/{reader.pk}/logs").json()["text"]

    # both ended: the volume is still there, on the engine and in the API, measured by the agent
    docker_host.agent._volumes_measured_at = float("-inf")  # measure now (every 60 s otherwise)
    docker_host.beat()
    assert engine.volumes.get(name) is not None
    got = api.get(f"/api/v1/volumes/{vol['id']}").json()
    assert (got["state"], got["host"], got["attached_to"]) == ("available", host.name, None)
    assert got["used_bytes"] > 0 and got["measured_at"]
    # deleted (two steps): hidden at once; purged after the grace, its data removed by the agent
    assert api.delete(f"/api/v1/volumes/{vol['id']}").status_code == 204
    assert api.get(f"/api/v1/volumes/{vol['id']}").status_code == 404
    assert engine.volumes.get(name) is not None  # not yet: the grace period
    settings.VOLUME_PURGE_GRACE_S = 0
    assert [v.pk for v in purge_due()] == [Volume.objects.get(pk=vol["id"]).pk]
    docker_host.beat()  # the answer names it; the agent removes it
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(name)
    docker_host.beat()  # its report without the volume: gone for good
    assert Volume.objects.get(pk=vol["id"]).host is None
