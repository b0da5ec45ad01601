from __future__ import annotations

from pathlib import Path

from fake_amdsmi import AMDSMI_STATUS_API_FAILED, AMDSMI_STATUS_IO, FakeAmdGpu, FakeAmdSmi, bdf

from agents.host.amdsmi import AmdSmiBackend, bdf_from_id


def mi300x(n: int = 4, hives: list[int | None] | None = None) -> FakeAmdSmi:
    hives = hives if hives is not None else [0] * n
    return FakeAmdSmi(
        [
            FakeAmdGpu(
                uuid=f"{i:02d}ff74a1-0000-1000-80b1-e2a11a0e3c2a",
                bdf_id=bdf(0, 0x0C + 0x10 * i),
                numa=i // 2,
                hive=hives[i],
            )
            for i in range(n)
        ]
    )


def test_bdf_id_decodes_like_the_sysfs_name() -> None:
    assert bdf_from_id(bdf(0, 0x3B, 0, 0)) == "0000:3b:00.0"
    assert bdf_from_id(bdf(1, 0xC1, 3, 1)) == "0001:c1:03.1"


def test_inventory_reads_uuid_model_vram_bus_numa() -> None:
    inv = AmdSmiBackend(mi300x(4)).inventory()
    assert [g.uuid for g in inv] == [f"{i:02d}ff74a1-0000-1000-80b1-e2a11a0e3c2a" for i in range(4)]
    g = inv[1]
    assert (g.model, g.vendor, g.memory_mib) == ("AMD Instinct MI300X", "amd", 196592)
    assert g.pci_bus_id == "0000:1c:00.0"
    assert [x.numa_node for x in inv] == [0, 0, 1, 1]
    assert g.mig_mode is None


def test_xgmi_hive_is_an_island_and_pcie_gpus_have_none() -> None:
    inv = AmdSmiBackend(mi300x(4, hives=[0, 0, None, None])).inventory()
    assert [g.nvlink_island for g in inv] == [0, 0, None, None]
    assert inv[0].nvlink_peers == [inv[1].uuid]
    assert inv[0].topology[inv[1].uuid] == "nvlink"
    assert inv[0].topology[inv[2].uuid] == "system"


def test_sample_reads_activity_vram_hotspot_power_ecc() -> None:
    smi = mi300x(1)
    smi.gpus[0].gfx, smi.gpus[0].umc, smi.gpus[0].vram_used_mb = 93, 55, 150000
    smi.gpus[0].ecc = (4, 0)
    (s,) = AmdSmiBackend(smi).sample()
    assert s.healthy and s.error is None
    assert (s.gpu_util, s.mem_util, s.mem_used_mib) == (93.0, 55.0, 150000)
    assert s.temperature_c == 40.0  # hotspot: MI300X has no edge sensor
    assert s.power_w == 150.0
    assert (s.ecc_corrected, s.ecc_uncorrected) == (4, 0)
    assert s.xid_events == []


def test_na_values_and_unsupported_probes_are_none() -> None:
    smi = mi300x(1)
    g = smi.gpus[0]
    g.gfx = "N/A"
    g.ecc = None
    g.power = {"socket_power": "N/A", "current_socket_power": "N/A", "average_socket_power": 88}
    (s,) = AmdSmiBackend(smi).sample()
    assert s.healthy and s.error is None
    assert s.gpu_util is None
    assert s.ecc_corrected is None
    assert s.power_w == 88.0  # older libraries only fill average_socket_power


def test_device_gone_marks_gpu_unhealthy_and_others_continue() -> None:
    smi = mi300x(2)
    backend = AmdSmiBackend(smi)
    backend.inventory()
    smi.gpus[0].broken["amdsmi_get_gpu_activity"] = AMDSMI_STATUS_IO
    a, b = backend.sample()
    assert not a.healthy and a.error is not None and "amdsmi_get_gpu_activity" in a.error
    assert b.healthy and b.temperature_c == 40.0


def test_other_library_error_is_recorded_not_fatal() -> None:
    smi = mi300x(1)
    smi.gpus[0].broken["amdsmi_get_power_info"] = AMDSMI_STATUS_API_FAILED
    (s,) = AmdSmiBackend(smi).sample()
    assert s.healthy
    assert s.power_w is None
    assert s.error is not None and "amdsmi_get_power_info" in s.error


def test_numa_falls_back_to_sysfs_when_the_library_cannot_say(tmp_path: Path) -> None:
    smi = mi300x(1)
    smi.gpus[0].broken["amdsmi_topo_get_numa_node_number"] = 2  # NOT_SUPPORTED
    d = tmp_path / "bus/pci/devices/0000:0c:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("1\n")
    assert AmdSmiBackend(smi, sysfs_root=tmp_path).inventory()[0].numa_node == 1


def test_close_shuts_down() -> None:
    smi = mi300x(1)
    AmdSmiBackend(smi).close()
    assert smi.shutdowns == 1
