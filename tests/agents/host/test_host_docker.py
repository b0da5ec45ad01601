"""The Docker runtime's container settings, checked without an engine (the arguments it
would pass to ``containers.run``); engine tests come with the Docker CI job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker  # noqa: F401  (pinned in requirements.txt: a missing SDK must fail, not skip)
import pytest

from agents.host.docker import (  # noqa: E402
    CAP_ADD,
    FALLBACK_NETWORK,
    DockerRuntime,
    amd_device_nodes,
    bridge_name,
    disk_quota_support,
)
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
    assert k["ports"] == {"22/tcp": ("127.0.0.1",)}  # loopback: only the agent reaches it
    assert k["ulimits"] == [{"Name": "nofile", "Soft": 65536, "Hard": 65536}]
    assert "storage_opt" not in k  # no disk limit asked for
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


def test_the_host_caps_pids_and_sets_the_publish_address_and_nofile() -> None:
    k = kwargs(pids_limit=512, nofile=4096, publish_address="10.0.0.5")
    assert k["pids_limit"] == 512  # the spec asked for 1024: the host's cap wins
    assert kwargs(pids_limit=8192)["pids_limit"] == 1024  # below the cap: the spec's
    assert k["ports"] == {"22/tcp": ("10.0.0.5",)}
    assert k["ulimits"] == [{"Name": "nofile", "Soft": 4096, "Hard": 4096}]
    assert kwargs(publish_address="")["ports"] == {"22/tcp": None}  # all addresses, if told


def test_a_container_without_a_network_goes_on_the_shared_tenant_network() -> None:
    rt = DockerRuntime(client=object())
    k = rt.run_kwargs(DesiredContainer(instance_id="c", tenant_id="t", kind="job", image="x"))
    assert k["network"] == FALLBACK_NETWORK == "gpucloud-tenants"


def test_tenant_bridges_share_the_prefix_the_egress_rules_match() -> None:
    names = {bridge_name(f"gpucloud-t-{i}") for i in range(100)}
    assert len(names) == 100
    assert all(n.startswith("gct") and len(n) == 15 for n in names)  # the kernel's limit


@pytest.mark.parametrize(
    ("driver", "backing", "supported"),
    [
        ("overlay2", "xfs", True),
        ("overlay2", "extfs", False),
        ("vfs", "extfs", False),
        ("vfs", "xfs", True),
        ("btrfs", "btrfs", True),
        ("zfs", "", True),
        ("fuse-overlayfs", "", False),
    ],
)
def test_which_storage_drivers_take_a_writable_layer_size(
    driver: str, backing: str, supported: bool
) -> None:
    info = {"Driver": driver, "DriverStatus": [["Backing Filesystem", backing]] if backing else []}
    why = disk_quota_support(info)
    assert (why is None) == supported
    if why:
        assert driver in why


def test_a_disk_limit_is_passed_only_once_the_engine_supports_it() -> None:
    rt = DockerRuntime(client=object(), disk_gib=50)
    assert rt.disk_quota is None  # not asked yet
    rt.disk_quota = "applied"
    assert rt.run_kwargs(SPEC)["storage_opt"] == {"size": "50G"}
    rt.disk_quota = "not applied: storage driver vfs cannot limit a container's writable layer"
    assert "storage_opt" not in rt.run_kwargs(SPEC)
