"""MIG through NVML: discovery, GPU instance profiles, creating and destroying GPU and
compute instances, and the inventory the agent registers with - against a fake that
keeps pynvml's call names, structs and error codes."""

from __future__ import annotations

import json

import pynvml
import pytest
from fake_nvml import A100_40GB_PROFILES, FakeGpu, FakeNvml

from agents.host.nvml import NvmlBackend
from agents.protocol import GpuInfo, MigDevice, ProtocolError, RegisterRequest

A100 = "GPU-a1000000-aaaa-bbbb-cccc-dddddddddddd"
L40S = "GPU-140500000-aaaa-bbbb-cccc-ddddddddddd"


def a100(*, mig_on: bool = True) -> FakeGpu:
    mode = pynvml.NVML_DEVICE_MIG_ENABLE if mig_on else pynvml.NVML_DEVICE_MIG_DISABLE
    return FakeGpu(uuid=A100, name="NVIDIA A100-SXM4-40GB", total_bytes=40960 * 1024 * 1024,
                   mig=(mode, mode), mig_profiles=dict(A100_40GB_PROFILES))


def test_profiles_are_discovered_with_names_slices_and_memory() -> None:
    backend = NvmlBackend(FakeNvml([a100()]))
    profiles = backend.mig_profiles(A100)
    assert [(p.name, p.slices, p.memory_mib, p.instances) for p in profiles] == [
        ("1g.5gb", 1, 4864, 7), ("2g.10gb", 2, 9856, 3), ("3g.20gb", 3, 19968, 2),
        ("4g.20gb", 4, 19968, 1), ("7g.40gb", 7, 40192, 1),
    ]
    assert profiles[0].profile == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE and profiles[0].id == 19


def test_a_created_mig_device_is_in_the_inventory_and_destroyed_again() -> None:
    nvml = FakeNvml([a100()])
    backend = NvmlBackend(nvml)
    assert backend.inventory()[0].mig_devices == []
    small = backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    big = backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert small.uuid.startswith("MIG-") and small.uuid != big.uuid
    assert (small.profile, small.slices, small.memory_mib) == ("1g.5gb", 1, 4864)
    assert (big.profile, big.slices) == ("3g.20gb", 3)
    (gpu,) = backend.inventory()
    assert gpu.mig_mode is True
    assert [d.uuid for d in gpu.mig_devices] == [small.uuid, big.uuid]
    backend.destroy_mig_device(A100, small.uuid)
    assert [d.uuid for d in backend.mig_devices(A100)] == [big.uuid]
    assert list(nvml.gpus[0].instances) == [big.gpu_instance_id]  # GPU and compute instance gone
    backend.destroy_mig_device(A100, small.uuid)  # already gone: nothing to do


def test_a_full_gpu_refuses_another_instance_with_nvmls_error() -> None:
    backend = NvmlBackend(FakeNvml([a100()]))
    backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)


def test_a_device_with_a_process_on_it_is_not_destroyed() -> None:
    nvml = FakeNvml([a100()])
    backend = NvmlBackend(nvml)
    dev = backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    nvml.gpus[0].busy_instances.add(dev.gpu_instance_id)
    with pytest.raises(pynvml.NVMLError_InUse):
        backend.destroy_mig_device(A100, dev.uuid)
    assert [d.uuid for d in backend.mig_devices(A100)] == [dev.uuid]


def test_a_failed_compute_instance_takes_its_gpu_instance_with_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    nvml = FakeNvml([a100()])

    def broken(gi, profile_id):  # type: ignore[no-untyped-def]
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(nvml, "nvmlGpuInstanceCreateComputeInstance", broken)
    backend = NvmlBackend(nvml)
    with pytest.raises(pynvml.NVMLError_Unknown):
        backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert nvml.gpus[0].instances == {}


def test_parts_without_mig_or_with_mig_off_answer_not_supported() -> None:
    nvml = FakeNvml([a100(mig_on=False), FakeGpu(uuid=L40S, name="NVIDIA L40S", mig=None)])
    backend = NvmlBackend(nvml)
    inv = backend.inventory()
    assert [(g.mig_mode, g.mig_devices) for g in inv] == [(False, []), (None, [])]
    assert backend.mig_profiles(L40S) == []
    assert backend.mig_devices(A100) == [] and backend.mig_devices(L40S) == []
    with pytest.raises(pynvml.NVMLError_NotSupported):
        backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)  # MIG mode off
    with pytest.raises(pynvml.NVMLError_NotSupported):
        backend.create_mig_device(L40S, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)


# ------------------------------------------------------------------- protocol


def test_mig_devices_round_trip_in_the_registration_and_are_optional() -> None:
    backend = NvmlBackend(FakeNvml([a100()]))
    backend.create_mig_device(A100, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    req = RegisterRequest(bootstrap_token="t", hostname="h", agent_version="1", gpu_backend="nvml",
                          runtime="docker", cpu_count=8, memory_mib=1024, gpus=backend.inventory())
    again = RegisterRequest.from_dict(json.loads(json.dumps(req.to_dict())))
    assert again == req and len(again.gpus[0].mig_devices) == 1
    # an older agent sends no mig_devices key at all
    old = req.to_dict()
    del old["gpus"][0]["mig_devices"]
    assert RegisterRequest.from_dict(old).gpus[0].mig_devices == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"uuid": "GPU-not-a-mig"}, "gpus[0].mig_devices[0].uuid"),
        ({"slices": 0}, "gpus[0].mig_devices[0].slices"),
        ({"memory_mib": -1}, "gpus[0].mig_devices[0].memory_mib"),
        ({"gpu_instance_id": "1"}, "gpus[0].mig_devices[0].gpu_instance_id"),
    ],
)
def test_a_bad_mig_device_is_refused_naming_the_field(change, field) -> None:  # type: ignore[no-untyped-def]
    dev = MigDevice(uuid="MIG-a1000000-0001-4000-8000-000000000001", gpu_instance_id=1,
                    compute_instance_id=0, profile="1g.5gb", slices=1, memory_mib=4864)
    gpu = GpuInfo(uuid=A100, index=0, model="A100", vendor="nvidia", memory_mib=40960, mig_mode=True,
                  mig_devices=[dev]).to_dict()
    gpu["mig_devices"][0].update(change)
    body = RegisterRequest(bootstrap_token="t", hostname="h", agent_version="1", gpu_backend="nvml",
                           runtime="docker", cpu_count=8, memory_mib=1024).to_dict()
    body["gpus"] = [gpu]
    with pytest.raises(ProtocolError) as e:
        RegisterRequest.from_dict(body)
    assert e.value.field == field


def test_mig_devices_need_mig_mode_and_unique_uuids() -> None:
    dev = MigDevice(uuid="MIG-a1000000-0001-4000-8000-000000000001", gpu_instance_id=1,
                    compute_instance_id=0, profile="1g.5gb", slices=1, memory_mib=4864).to_dict()
    base = {"uuid": A100, "index": 0, "model": "A100", "vendor": "nvidia", "memory_mib": 40960}
    with pytest.raises(ProtocolError, match="MIG mode"):
        GpuInfo.from_dict({**base, "mig_mode": False, "mig_devices": [dev]})
    with pytest.raises(ProtocolError, match="unique"):
        GpuInfo.from_dict({**base, "mig_mode": True, "mig_devices": [dev, dev]})
