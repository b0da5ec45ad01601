"""A stand-in for the ``pynvml`` module (nvidia-ml-py) at the hardware edge.

It keeps pynvml's function names and signatures and returns pynvml's own types: device
handles are real ``c_nvmlDevice_t`` pointers, memory info is a ``c_nvmlMemory_t`` (bytes),
utilisation a ``c_nvmlUtilization_t``, PCI info an ``nvmlPciInfo_t``, events a
``c_nvmlEventData_t``. Errors are the REAL pynvml exception classes, built the way
pynvml builds them (``NVMLError(code)`` picks the subclass).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import pynvml

GIB = 1024**3


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    total_bytes: int = 81559 * 1024 * 1024
    used_bytes: int = 1024 * 1024 * 1024
    bus_id: str | bytes = "00000000:18:00.0"  # NVML's 8-digit domain form
    numa: int | None = 0  # None -> NotSupported
    util: tuple[int, int] | None = (0, 0)  # (gpu %, memory %)
    temp_c: int | None = 35
    power_mw: int | None = 70000
    ecc: tuple[int, int] | None = (0, 0)  # (corrected, uncorrected) volatile
    mig: tuple[int, int] | None = (0, 0)  # (current, pending); None -> NotSupported
    nvlink_remotes: list[str] | None = None  # bus ids at the far end; None -> NotSupported
    events_supported: bool = True
    lost: bool = False  # fallen off the bus: every call raises GPU_IS_LOST
    broken: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Module-like: constants and exception classes are copied from the real pynvml."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        topology: dict[tuple[int, int], int] | None = None,
        has_numa_function: bool = True,
        events_supported: bool = True,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.topology = topology or {}
        self._handles = [ctypes.pointer(pynvml.struct_c_nvmlDevice_t()) for _ in gpus]
        self.initialised = False
        self.shutdowns = 0
        self.pending_events: list[tuple[int, int]] = []  # (gpu index, xid)
        self.registered: set[int] = set()
        self.event_sets_freed = 0
        self._events_supported = events_supported
        if not has_numa_function:  # old pynvml: the binding does not exist at all
            self.nvmlDeviceGetNumaNodeId = None

    # --- helpers ------------------------------------------------------------------------

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        addr = ctypes.addressof(handle.contents)
        for i, h in enumerate(self._handles):
            if ctypes.addressof(h.contents) == addr:
                gpu = self.gpus[i]
                if gpu.lost:
                    raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
                if fn in gpu.broken:
                    raise _err(gpu.broken[fn])
                return gpu
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def xid(self, index: int, xid: int) -> None:
        """The driver reports XID ``xid`` on GPU ``index`` (delivered if registered)."""
        if index in self.registered:
            self.pending_events.append((index, xid))

    # --- init ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    # --- device queries -----------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> pynvml.c_nvmlMemory_t:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used = gpu.total_bytes, gpu.used_bytes
        mem.free = gpu.total_bytes - gpu.used_bytes
        return mem

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return self._pci(gpu.bus_id)

    @staticmethod
    def _pci(bus_id: str | bytes) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        raw = bus_id.encode() if isinstance(bus_id, str) else bus_id
        info.busId = raw
        info.busIdLegacy = raw
        parts = raw.decode().split(":")
        info.domain, info.bus = int(parts[0], 16), int(parts[1], 16)
        return info

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.numa is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if gpu.mig is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig[0], gpu.mig[1]]

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if gpu.nvlink_remotes is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlink_remotes):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> pynvml.nvmlPciInfo_t:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkRemotePciInfo")
        if gpu.nvlink_remotes is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.nvlink_remotes):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._pci(gpu.nvlink_remotes[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        self._gpu(device1, "nvmlDeviceGetTopologyCommonAncestor")
        self._gpu(device2, "nvmlDeviceGetTopologyCommonAncestor")
        a = self._index(device1)
        b = self._index(device2)
        key = (min(a, b), max(a, b))
        if key not in self.topology:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.topology[key]

    def _index(self, handle: Any) -> int:
        addr = ctypes.addressof(handle.contents)
        return next(i for i, h in enumerate(self._handles) if ctypes.addressof(h.contents) == addr)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.util is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        u = pynvml.c_nvmlUtilization_t()
        u.gpu, u.memory = gpu.util
        return u

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.temp_c is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        if gpu.power_mw is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:  # noqa: N803
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if gpu.ecc is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if counterType not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ecc[0] if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc[1]

    # --- events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        if not self._events_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlEventSet_t()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:  # noqa: N803
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if not gpu.events_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert eventTypes & pynvml.nvmlEventTypeXidCriticalError
        self.registered.add(self._index(handle))

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> pynvml.c_nvmlEventData_t:  # noqa: N803
        if not self.pending_events:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.pending_events.pop(0)
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handles[index]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, eventSet: Any) -> None:  # noqa: N803
        self.event_sets_freed += 1


def hgx(n: int = 4) -> FakeNvml:
    """An HGX-like board: every GPU's NVLinks go to NVSwitches (not to other GPUs)."""
    gpus = [
        FakeGpu(
            uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
            bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            numa=0 if i < n // 2 else 1,
            nvlink_remotes=[f"00000000:{0xA0 + s:02X}:00.0" for s in range(4)],  # NVSwitches
        )
        for i in range(n)
    ]
    topo = {
        (a, b): (
            pynvml.NVML_TOPOLOGY_NODE
            if (a < n // 2) == (b < n // 2)
            else pynvml.NVML_TOPOLOGY_SYSTEM
        )
        for a in range(n)
        for b in range(a + 1, n)
    }
    return FakeNvml(gpus, topology=topo)
