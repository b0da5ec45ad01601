"""A stand-in for AMD's ``amdsmi`` Python module at the hardware edge.

The real package (``pip install amdsmi``) cannot even be imported without ROCm's
``libamd_smi.so``, so this fake is written from its source and docs (amdsmi 7.0.2):
the same function names and argument order, dict return values with the same keys,
``"N/A"`` for values a device cannot report, enum-typed sensor arguments (a plain int
raises ``AmdSmiParameterException`` as the real one does) and the exception classes'
shape: ``AmdSmiLibraryException(err_code).get_error_code()``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# amdsmi_wrapper.AMDSMI_STATUS_*
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_API_FAILED = 7
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_NOT_FOUND = 31


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = f"AMDSMI_STATUS {err_code}"

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiParameterException(AmdSmiException):
    pass


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1


class AmdSmiLinkType(IntEnum):
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_PCIE = 1
    AMDSMI_LINK_TYPE_XGMI = 2
    AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
    AMDSMI_LINK_TYPE_UNKNOWN = 4


class amdsmi_processor_handle(ctypes.c_void_p):  # noqa: N801 - the real name
    pass


@dataclass
class FakeAmdGpu:
    uuid: str
    market_name: str = "AMD Instinct MI300X"
    vram_mb: int = 196592
    bdf_id: int = 0  # encoded as amdsmi_get_gpu_bdf_id returns it
    numa: int = 0
    hive: int | None = 0  # GPUs with the same hive are linked by xGMI
    gfx: int | str = 0
    umc: int | str = 0
    vram_used_mb: int = 512
    hotspot_c: int = 40
    power: dict[str, Any] = field(
        default_factory=lambda: {
            "socket_power": 150,
            "current_socket_power": 150,
            "average_socket_power": "N/A",
            "gfx_voltage": 800,
            "soc_voltage": 700,
            "mem_voltage": 1100,
            "power_limit": 750,
        }
    )
    ecc: tuple[int, int] | None = (0, 0)
    broken: dict[str, int] = field(default_factory=dict)  # function -> status code


def bdf(domain: int, bus: int, device: int = 0, function: int = 0) -> int:
    return (domain << 32) | (bus << 8) | (device << 3) | function


class FakeAmdSmi:
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiLinkType = AmdSmiLinkType

    def __init__(self, gpus: list[FakeAmdGpu]) -> None:
        self.gpus = gpus
        self._handles = [amdsmi_processor_handle(0x1000 + i) for i in range(len(gpus))]
        self.initialised = False
        self.shutdowns = 0

    def _gpu(self, handle: Any, fn: str) -> FakeAmdGpu:
        if not isinstance(handle, amdsmi_processor_handle):
            raise AmdSmiParameterException(handle)
        if not self.initialised:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT
        gpu = self.gpus[[h.value for h in self._handles].index(handle.value)]
        if fn in gpu.broken:
            raise AmdSmiLibraryException(gpu.broken[fn])
        return gpu

    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def amdsmi_get_processor_handles(self) -> list[amdsmi_processor_handle]:
        if not self.initialised:
            raise AmdSmiLibraryException(32)
        return list(self._handles)

    def amdsmi_get_gpu_device_uuid(self, processor_handle: Any) -> str:
        return self._gpu(processor_handle, "amdsmi_get_gpu_device_uuid").uuid

    def amdsmi_get_gpu_asic_info(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu(processor_handle, "amdsmi_get_gpu_asic_info")
        return {
            "market_name": g.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": "0x0123456789ABCDEF",
            "oam_id": 0,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        }

    def amdsmi_get_gpu_vram_info(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu(processor_handle, "amdsmi_get_gpu_vram_info")
        return {
            "vram_type": 11,
            "vram_vendor": "HYNIX",
            "vram_size": g.vram_mb,
            "vram_bit_width": 8192,
            "vram_max_bandwidth": "N/A",
        }

    def amdsmi_get_gpu_bdf_id(self, processor_handle: Any) -> int:
        return self._gpu(processor_handle, "amdsmi_get_gpu_bdf_id").bdf_id

    def amdsmi_topo_get_numa_node_number(self, processor_handle: Any) -> int:
        return self._gpu(processor_handle, "amdsmi_topo_get_numa_node_number").numa

    def amdsmi_topo_get_link_type(
        self, processor_handle_src: Any, processor_handle_dst: Any
    ) -> dict[str, int]:
        a = self._gpu(processor_handle_src, "amdsmi_topo_get_link_type")
        b = self._gpu(processor_handle_dst, "amdsmi_topo_get_link_type")
        if a.hive is not None and a.hive == b.hive:
            return {"hops": 1, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI}
        return {"hops": 2, "type": AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE}

    def amdsmi_get_gpu_activity(self, processor_handle: Any) -> dict[str, Any]:
        g = self._gpu(processor_handle, "amdsmi_get_gpu_activity")
        return {"gfx_activity": g.gfx, "umc_activity": g.umc, "mm_activity": "N/A"}

    def amdsmi_get_gpu_vram_usage(self, processor_handle: Any) -> dict[str, int]:
        g = self._gpu(processor_handle, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": g.vram_mb, "vram_used": g.vram_used_mb}

    def amdsmi_get_temp_metric(
        self,
        processor_handle: Any,
        sensor_type: AmdSmiTemperatureType,
        metric: AmdSmiTemperatureMetric,
    ) -> int:
        g = self._gpu(processor_handle, "amdsmi_get_temp_metric")
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric)
        if sensor_type == AmdSmiTemperatureType.EDGE:  # MI300X has no edge sensor
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return g.hotspot_c

    def amdsmi_get_power_info(self, processor_handle: Any) -> dict[str, Any]:
        return dict(self._gpu(processor_handle, "amdsmi_get_power_info").power)

    def amdsmi_get_gpu_total_ecc_count(self, processor_handle: Any) -> dict[str, int]:
        g = self._gpu(processor_handle, "amdsmi_get_gpu_total_ecc_count")
        if g.ecc is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return {"correctable_count": g.ecc[0], "uncorrectable_count": g.ecc[1], "deferred_count": 0}
