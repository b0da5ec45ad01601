from __future__ import annotations

import json
from typing import Any

import pytest

from agents.protocol import (
    PROTOCOL_VERSION,
    DesiredContainer,
    GpuInfo,
    GpuSample,
    Heartbeat,
    HeartbeatResponse,
    ObservedContainer,
    ProtocolError,
    RegisterRequest,
    RegisterResponse,
)

GPU = GpuInfo(
    uuid="GPU-1",
    index=0,
    model="NVIDIA H100 80GB HBM3",
    vendor="nvidia",
    memory_mib=81559,
    pci_bus_id="0000:18:00.0",
    numa_node=0,
    nvlink_island=0,
    nvlink_peers=["GPU-2"],
    topology={"GPU-2": "nvlink"},
    mig_mode=False,
)
DESIRED = DesiredContainer(
    instance_id="i-1",
    tenant_id="t-1",
    kind="job",
    image="pytorch/pytorch:2.4.0",
    command=["python", "train.py"],
    env={"EPOCHS": "3"},
    ports=[22, 8888],
    gpu_uuids=["GPU-1", "GPU-2"],
    gpu_milli=1000,
    vcpus=16.0,
    memory_mib=65536,
    pids_limit=2048,
    network="gpucloud-t-1",
    labels={"team": "ml"},
)

MESSAGES: list[Any] = [
    RegisterRequest("boot", "h1", "0.1.0", "nvml", "docker", 64, 512000, [GPU]),
    RegisterRequest("boot", "h1", "0.1.0", "nvml", "docker", 64, 512000, [], "gph_previous"),
    RegisterResponse("host-1", "tok", 5.0),
    Heartbeat(
        "host-1",
        7,
        [GpuSample("GPU-1", True, None, 50.0, 20.0, 1024, 60.0, 300.5, 0, 0, [13])],
        [
            ObservedContainer(
                "i-1",
                "exited",
                "c1",
                0,
                "2025-01-01T00:00:00Z",
                "2025-01-01T01:00:00Z",
                None,
                {"22": 30001},
            )
        ],
        "0.1.0",
    ),
    Heartbeat("host-1", 8, [], None),
    HeartbeatResponse([DESIRED], 5.0, "new-token"),
    HeartbeatResponse([], 10.0),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(msg: Any) -> None:
    wire = json.loads(json.dumps(msg.to_dict()))
    assert wire["protocol_version"] == PROTOCOL_VERSION
    assert type(msg).from_dict(wire) == msg


def test_unknown_keys_are_ignored_for_forward_compatibility() -> None:
    d = RegisterResponse("h", "t", 5).to_dict() | {"future_field": 1}
    assert RegisterResponse.from_dict(d) == RegisterResponse("h", "t", 5.0)


def test_other_protocol_version_is_refused() -> None:
    d = RegisterResponse("h", "t", 5).to_dict() | {"protocol_version": 2}
    with pytest.raises(ProtocolError) as e:
        RegisterResponse.from_dict(d)
    assert e.value.field == "protocol_version"


def desired(**overrides: Any) -> dict[str, Any]:
    return {"desired": [DESIRED.to_dict() | overrides], "heartbeat_interval_s": 5}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"heartbeat_interval_s": 5}, "desired"),
        ({"desired": [], "heartbeat_interval_s": 0}, "heartbeat_interval_s"),
        ({"desired": [], "heartbeat_interval_s": "5"}, "heartbeat_interval_s"),
        (desired(kind="vm"), "desired[0].kind"),
        (desired(instance_id=""), "desired[0].instance_id"),
        (desired(instance_id=7), "desired[0].instance_id"),
        (desired(gpu_milli=1001), "desired[0].gpu_milli"),
        (desired(vcpus=0), "desired[0].vcpus"),
        (desired(memory_mib=True), "desired[0].memory_mib"),
        (desired(ports=[0]), "desired[0].ports[0]"),
        (desired(env={"A": 1}), "desired[0].env"),
        (desired(gpu_uuids="GPU-1"), "desired[0].gpu_uuids"),
        ({"desired": [DESIRED.to_dict(), DESIRED.to_dict()], "heartbeat_interval_s": 5}, "desired"),
        ({"desired": ["x"], "heartbeat_interval_s": 5}, "desired[0]"),
    ],
)
def test_bad_heartbeat_response_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as e:
        HeartbeatResponse.from_dict(body)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"bootstrap_token": ""}, "bootstrap_token"),
        ({"cpu_count": 0}, "cpu_count"),
        ({"gpus": [GPU.to_dict(), GPU.to_dict()]}, "gpus"),
        ({"gpus": [GPU.to_dict() | {"topology": {"GPU-2": "far"}}]}, "gpus[0].topology.GPU-2"),
        ({"gpus": [GPU.to_dict() | {"memory_mib": -1}]}, "gpus[0].memory_mib"),
    ],
)
def test_bad_register_request_names_the_field(change: dict[str, Any], field: str) -> None:
    body = MESSAGES[0].to_dict() | change
    with pytest.raises(ProtocolError) as e:
        RegisterRequest.from_dict(body)
    assert e.value.field == field


def test_observed_state_must_be_known() -> None:
    with pytest.raises(ProtocolError) as e:
        Heartbeat.from_dict(
            {"host_id": "h", "seq": 1, "containers": [{"instance_id": "i", "state": "zombie"}]}
        )
    assert e.value.field == "containers[0].state"


def test_not_an_object_is_refused() -> None:
    with pytest.raises(ProtocolError):
        Heartbeat.from_dict([1, 2])


def test_desired_defaults_fill_optional_fields() -> None:
    d = DesiredContainer.from_dict(
        {"instance_id": "i", "tenant_id": "t", "kind": "instance", "image": "ubuntu"}
    )
    assert (d.gpu_uuids, d.gpu_milli, d.command, d.network) == ([], 1000, [], "")


def test_a_desired_container_carries_its_checkpoint_and_notice_only_when_set():
    from agents.protocol import DesiredContainer

    plain = DesiredContainer(instance_id="a", tenant_id="t", kind="job", image="img")
    assert "checkpoint_signal" not in plain.to_dict() and "stop_by" not in plain.to_dict()
    noticed = DesiredContainer(instance_id="a", tenant_id="t", kind="job", image="img",
                               checkpoint_signal="SIGUSR1", checkpoint_grace_s=60, stop_by="2026-12-03T16:00:00Z")
    assert DesiredContainer.from_dict(json.loads(json.dumps(noticed.to_dict()))) == noticed
    for bad, field in (({"checkpoint_signal": "SIGKILL"}, "checkpoint_signal"),
                       ({"checkpoint_signal": "SIGUSR1", "checkpoint_grace_s": 3601}, "checkpoint_grace_s")):
        with pytest.raises(ProtocolError) as err:
            DesiredContainer.from_dict({**plain.to_dict(), **bad})
        assert err.value.field == field
