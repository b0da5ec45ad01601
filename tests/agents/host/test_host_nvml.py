from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from fake_nvml import FakeGpu, FakeNvml, hgx

from agents.host.nvml import NvmlBackend


def uuid(i: int) -> str:
    return f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"


def test_inventory_names_gpus_by_uuid_with_memory_and_normalised_bus_id() -> None:
    inv = NvmlBackend(hgx(4)).inventory()
    assert [g.uuid for g in inv] == [uuid(i) for i in range(4)]
    assert [g.index for g in inv] == [0, 1, 2, 3]
    g = inv[1]
    assert g.model == "NVIDIA H100 80GB HBM3"
    assert g.vendor == "nvidia"
    assert g.memory_mib == 81559  # bytes from c_nvmlMemory_t.total -> MiB
    assert g.pci_bus_id == "0000:28:00.0"  # NVML "00000000:28:00.0" -> sysfs form
    assert g.mig_mode is False


def test_nvswitch_board_is_one_island_and_numa_comes_from_nvml() -> None:
    inv = NvmlBackend(hgx(4)).inventory()
    assert {g.nvlink_island for g in inv} == {0}
    assert inv[0].nvlink_peers == [uuid(1), uuid(2), uuid(3)]
    assert [g.numa_node for g in inv] == [0, 0, 1, 1]
    assert set(inv[0].topology.values()) == {"nvlink"}


def test_direct_nvlink_pairs_make_two_islands_and_pcie_levels_for_the_rest(tmp_path: Path) -> None:
    bus = ["00000000:18:00.0", "00000000:28:00.0", "00000000:B8:00.0", "00000000:C8:00.0"]
    peer = {0: 1, 1: 0, 2: 3, 3: 2}
    gpus = [
        FakeGpu(uuid=uuid(i), bus_id=bus[i], numa=None, nvlink_remotes=[bus[peer[i]]] * 2)
        for i in range(4)
    ]
    topo = {
        (0, 1): pynvml.NVML_TOPOLOGY_SINGLE,
        (0, 2): pynvml.NVML_TOPOLOGY_SYSTEM,
        (0, 3): pynvml.NVML_TOPOLOGY_SYSTEM,
        (1, 2): pynvml.NVML_TOPOLOGY_SYSTEM,
        (1, 3): pynvml.NVML_TOPOLOGY_SYSTEM,
        (2, 3): pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    }
    # NUMA not supported by NVML here: the sysfs fallback answers (-1 means "none").
    for i, node in enumerate(["0", "0", "1", "-1"]):
        d = tmp_path / "bus/pci/devices" / f"0000:{bus[i][9:].lower()}"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")

    inv = NvmlBackend(FakeNvml(gpus, topology=topo), sysfs_root=tmp_path).inventory()

    assert [g.nvlink_island for g in inv] == [0, 0, 1, 1]
    assert inv[0].nvlink_peers == [uuid(1)]
    assert inv[0].topology == {uuid(1): "nvlink", uuid(2): "system", uuid(3): "system"}
    assert inv[2].topology[uuid(3)] == "nvlink"
    assert [g.numa_node for g in inv] == [0, 0, 1, None]


def test_pcie_only_gpu_without_nvlink_mig_or_numa_function_has_no_island() -> None:
    gpus = [
        FakeGpu(uuid=uuid(0), name="NVIDIA L40S", nvlink_remotes=None, mig=None),
        FakeGpu(
            uuid=uuid(1),
            name="NVIDIA L40S",
            bus_id=b"00000000:19:00.0",
            nvlink_remotes=None,
            mig=None,
        ),
    ]
    nvml = FakeNvml(
        gpus, topology={(0, 1): pynvml.NVML_TOPOLOGY_HOSTBRIDGE}, has_numa_function=False
    )
    inv = NvmlBackend(nvml, sysfs_root=Path("/nonexistent")).inventory()
    assert [g.nvlink_island for g in inv] == [None, None]
    assert inv[0].nvlink_peers == []
    assert inv[0].topology == {uuid(1): "host_bridge"}
    assert inv[0].mig_mode is None
    assert inv[1].pci_bus_id == "0000:19:00.0"  # busId as bytes works too
    assert inv[0].numa_node is None


def test_mig_enabled_is_reported() -> None:
    nvml = FakeNvml([FakeGpu(uuid=uuid(0), mig=(1, 1))])
    assert NvmlBackend(nvml).inventory()[0].mig_mode is True


def test_sample_converts_units() -> None:
    nvml = FakeNvml(
        [
            FakeGpu(
                uuid=uuid(0),
                util=(87, 41),
                used_bytes=40 * 1024**3,
                temp_c=66,
                power_mw=612345,
                ecc=(3, 1),
            )
        ]
    )
    (s,) = NvmlBackend(nvml).sample()
    assert s.uuid == uuid(0)
    assert s.healthy and s.error is None
    assert (s.gpu_util, s.mem_util) == (87.0, 41.0)
    assert s.mem_used_mib == 40 * 1024
    assert s.temperature_c == 66.0
    assert s.power_w == pytest.approx(612.345)  # NVML reports milliwatts
    assert (s.ecc_corrected, s.ecc_uncorrected) == (3, 1)


def test_not_supported_probes_are_none_not_errors() -> None:
    nvml = FakeNvml([FakeGpu(uuid=uuid(0), util=None, power_mw=None, ecc=None, temp_c=None)])
    (s,) = NvmlBackend(nvml).sample()
    assert s.healthy and s.error is None
    assert s.gpu_util is s.power_w is s.ecc_corrected is s.temperature_c is None
    assert s.mem_used_mib == 1024


def test_gpu_fallen_off_the_bus_is_unhealthy_and_the_others_still_sampled() -> None:
    nvml = hgx(4)
    backend = NvmlBackend(nvml)
    backend.inventory()
    nvml.gpus[2].lost = True

    samples = backend.sample()

    assert [s.uuid for s in samples] == [uuid(i) for i in range(4)]
    lost = samples[2]
    assert not lost.healthy
    assert lost.error is not None and "GPU is lost" in lost.error
    assert all(s.healthy and s.temperature_c == 35.0 for i, s in enumerate(samples) if i != 2)


def test_gpu_lost_before_inventory_is_skipped_not_named_by_index() -> None:
    nvml = hgx(3)
    nvml.gpus[1].lost = True
    inv = NvmlBackend(nvml).inventory()
    assert [g.uuid for g in inv] == [uuid(0), uuid(2)]


def test_other_nvml_error_in_one_probe_is_recorded_and_the_rest_still_reported() -> None:
    gpu = FakeGpu(uuid=uuid(0), broken={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_UNKNOWN})
    (s,) = NvmlBackend(FakeNvml([gpu])).sample()
    assert s.healthy
    assert s.error is not None and "nvmlDeviceGetPowerUsage" in s.error
    assert s.power_w is None
    assert s.temperature_c == 35.0


def test_xid_events_are_drained_per_gpu_and_fatal_ones_mark_unhealthy() -> None:
    nvml = hgx(2)
    backend = NvmlBackend(nvml)
    backend.inventory()
    nvml.xid(0, 13)  # graphics engine exception: the application's fault
    nvml.xid(1, 79)  # fallen off the bus

    first = {s.uuid: s for s in backend.sample()}
    assert first[uuid(0)].xid_events == [13] and first[uuid(0)].healthy
    assert first[uuid(1)].xid_events == [79] and not first[uuid(1)].healthy
    assert "79" in (first[uuid(1)].error or "")

    second = backend.sample()
    assert all(s.xid_events == [] for s in second)


def test_xid_events_unsupported_does_not_stop_sampling() -> None:
    nvml = FakeNvml([FakeGpu(uuid=uuid(0), events_supported=False)], events_supported=True)
    backend = NvmlBackend(nvml)
    assert backend.sample()[0].healthy
    nvml2 = FakeNvml([FakeGpu(uuid=uuid(0))], events_supported=False)
    assert NvmlBackend(nvml2).sample()[0].xid_events == []


def test_close_frees_event_set_and_shuts_nvml_down() -> None:
    nvml = hgx(1)
    backend = NvmlBackend(nvml)
    backend.inventory()
    backend.close()
    assert nvml.event_sets_freed == 1
    assert nvml.shutdowns == 1
    assert not nvml.initialised


def test_fake_raises_the_real_pynvml_classes() -> None:
    nvml = hgx(1)
    nvml.nvmlInit()
    nvml.gpus[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0))
