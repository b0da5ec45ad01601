"""The Docker runtime's container settings, checked without an engine (the arguments it
would pass to ``containers.run``); engine tests come with the Docker CI job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker  # noqa: F401  (pinned in requirements.txt: a missing SDK must fail, not skip)

from agents.host.docker import CAP_ADD, DockerRuntime, amd_device_nodes  # noqa: E402
from agents.protocol import DesiredContainer  # noqa: E402

SPEC = DesiredContainer(
    instance_id="i-42",
    tenant_id="t-7",
    kind="instance",
    image="ghcr.io/acme/pytorch:2.4",
    command=["sleep", "infinity"],
    env={"FOO": "bar"},
    ports=[22],
    gpu_uuids=["GPU-a", "GPU-b"],
    vcpus=8,
    memory_mib=32768,
    pids_limit=1024,
    network="gpucloud-t-7",
    labels={"gpucloud.managed": "0", "team": "ml"},
)


def kwargs(**kw: Any) -> dict[str, Any]:
    return DockerRuntime(client=object(), **kw).run_kwargs(SPEC)


def test_nvidia_gpus_are_pinned_by_uuid() -> None:
    k = kwargs()
    (req,) = k["device_requests"]
    assert req["DeviceIDs"] == ["GPU-a", "GPU-b"]
    assert req["Capabilities"] == [["gpu"]]
    assert k["environment"]["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert k["environment"]["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert k["environment"]["FOO"] == "bar"


def test_limits_and_no_privileges() -> None:
    k = kwargs()
    assert k["nano_cpus"] == 8_000_000_000
    assert k["mem_limit"] == k["memswap_limit"] == "32768m"
    assert k["pids_limit"] == 1024
    assert k["privileged"] is False
    assert k["cap_drop"] == ["ALL"]
    assert set(k["cap_add"]) == set(CAP_ADD)
    assert not {"SYS_ADMIN", "NET_ADMIN", "NET_RAW", "MKNOD", "SYS_PTRACE"} & set(k["cap_add"])
    assert k["security_opt"] == ["no-new-privileges:true"]
    assert k["network"] == "gpucloud-t-7"
    assert k["ports"] == {"22/tcp": None}
    assert k["restart_policy"] == {"Name": "no"}


def test_gpucloud_labels_cannot_be_overridden_by_the_spec() -> None:
    labels = kwargs()["labels"]
    assert labels["gpucloud.managed"] == "1"
    assert labels["gpucloud.instance"] == "i-42" and labels["gpucloud.tenant"] == "t-7"
    assert labels["team"] == "ml"
    assert kwargs()["name"] == "gpucloud-i-42"


def test_no_gpu_means_no_gpu_visible() -> None:
    rt = DockerRuntime(client=object())
    k = rt.run_kwargs(DesiredContainer(instance_id="c", tenant_id="t", kind="job", image="busybox"))
    assert "device_requests" not in k
    assert k["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_amd_gpus_get_kfd_and_only_their_dri_nodes(tmp_path: Path) -> None:
    for bus, nodes in {
        "0000:0c:00.0": ["card1", "renderD128"],
        "0000:1c:00.0": ["card2", "renderD129"],
    }.items():
        for n in nodes:
            (tmp_path / "bus/pci/devices" / bus / "drm" / n).mkdir(parents=True)
    devs = {
        "GPU-a": amd_device_nodes("0000:0c:00.0", tmp_path),
        "GPU-b": amd_device_nodes("0000:1c:00.0", tmp_path),
        "GPU-c": ["/dev/dri/renderD130"],
    }
    k = kwargs(gpu_vendor="amd", amd_devices=devs)
    assert k["devices"] == [
        "/dev/kfd:/dev/kfd:rwm",
        "/dev/dri/card1:/dev/dri/card1:rwm",
        "/dev/dri/renderD128:/dev/dri/renderD128:rwm",
        "/dev/dri/card2:/dev/dri/card2:rwm",
        "/dev/dri/renderD129:/dev/dri/renderD129:rwm",
    ]
    assert "device_requests" not in k
    assert amd_device_nodes("0000:ff:00.0", tmp_path) == []
