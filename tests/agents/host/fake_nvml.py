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

# An A100 40GB's MIG profiles: NVML profile enum -> (profile id, slices, memory MB,
# instances that fit, name). ``FakeGpu.mig_profiles`` None: the part has no MIG.
A100_40GB_PROFILES: dict[int, tuple[int, int, int, int, str]] = {
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE: (19, 1, 4864, 7, "MIG 1g.5gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE: (14, 2, 9856, 3, "MIG 2g.10gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE: (9, 3, 19968, 2, "MIG 3g.20gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE: (5, 4, 19968, 1, "MIG 4g.20gb"),
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE: (0, 7, 40192, 1, "MIG 7g.40gb"),
}
_MIG_SLICES = 7


@dataclass
class FakeGpuInstance:
    id: int
    profile_id: int
    slices: int
    memory_mb: int
    start: int
    handle: Any = None
    compute: dict[int, tuple[int, Any]] = field(default_factory=dict)  # ci id -> (profile id, handle)
    mig_uuid: str = ""
    mig_handle: Any = None


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
    mig_profiles: dict[int, tuple[int, int, int, int, str]] | None = None  # None: no MIG
    instances: dict[int, FakeGpuInstance] = field(default_factory=dict)  # GPU instances by id
    busy_instances: set[int] = field(default_factory=set)  # GI ids with running processes
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

    # --- MIG (GPU instances, compute instances, MIG devices) ------------------------------

    def _mig_gpu(self, handle: Any, fn: str, *, enabled: bool = True) -> FakeGpu:
        """The parent GPU; NOT_SUPPORTED on parts without MIG (or, where NVML needs it,
        with MIG mode off), as the real library answers."""
        gpu = self._gpu(handle, fn)
        if gpu.mig is None or gpu.mig_profiles is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if enabled and gpu.mig[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _gi(self, gi_handle: Any) -> tuple[FakeGpu, FakeGpuInstance]:
        addr = ctypes.addressof(gi_handle.contents)
        for gpu in self.gpus:
            for inst in gpu.instances.values():
                if ctypes.addressof(inst.handle.contents) == addr:
                    return gpu, inst
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_device(self, handle: Any) -> tuple[FakeGpu, FakeGpuInstance] | None:
        addr = ctypes.addressof(handle.contents)
        for gpu in self.gpus:
            for inst in gpu.instances.values():
                if inst.mig_handle is not None and ctypes.addressof(inst.mig_handle.contents) == addr:
                    return gpu, inst
        return None

    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        gpu = self._mig_gpu(device, "nvmlDeviceSetMigMode", enabled=False)
        if gpu.instances:
            raise _err(pynvml.NVML_ERROR_IN_USE)
        gpu.mig = (mode, mode)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        gpu = self._mig_gpu(device, "nvmlDeviceGetGpuInstanceProfileInfo", enabled=False)
        assert gpu.mig_profiles is not None
        if profile not in gpu.mig_profiles:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, slices, mem, count, name = gpu.mig_profiles[profile]
        info: Any = (
            pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlGpuInstanceProfileInfo_t()
        )
        info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = pid, slices, count, mem
        info.multiprocessorCount = 14 * slices
        if version == 2:
            info.name = name.encode()
        return info

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def _profile_by_id(self, gpu: FakeGpu, profile_id: int) -> tuple[int, int, int, int, str]:
        assert gpu.mig_profiles is not None
        for row in gpu.mig_profiles.values():
            if row[0] == profile_id:
                return row
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:  # noqa: N803
        gpu = self._mig_gpu(device, "nvmlDeviceCreateGpuInstance")
        pid, slices, mem, count, _name = self._profile_by_id(gpu, profileId)
        used = sum(i.slices for i in gpu.instances.values())
        same = sum(1 for i in gpu.instances.values() if i.profile_id == pid)
        if used + slices > _MIG_SLICES or same >= count:
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in range(1, 64) if i not in gpu.instances)
        inst = FakeGpuInstance(gi_id, pid, slices, mem, used,
                               handle=ctypes.pointer(pynvml.struct_c_nvmlGpuInstance_t()))
        gpu.instances[gi_id] = inst
        return inst.handle

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:  # noqa: N803
        gpu = self._mig_gpu(device, "nvmlDeviceGetGpuInstanceById")
        inst = gpu.instances.get(gpuInstanceId)
        if inst is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return inst.handle

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> pynvml.c_nvmlGpuInstanceInfo_t:  # noqa: N803
        gpu, inst = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._handles[self.gpus.index(gpu)]
        info.id, info.profileId = inst.id, inst.profile_id
        info.placement.start, info.placement.size = inst.start, inst.slices
        return info

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:  # noqa: N803
        gpu, inst = self._gi(gpuInstance)
        if inst.compute or inst.id in gpu.busy_instances:
            raise _err(pynvml.NVML_ERROR_IN_USE)
        del gpu.instances[inst.id]
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2  # noqa: N803
    ) -> Any:
        _gpu, inst = self._gi(device)  # pynvml names the GPU instance "device" here
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        slices = {
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
        }.get(profile)
        if slices is None or slices > inst.slices:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any = (
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        info.id, info.sliceCount, info.instanceCount = profile, slices, inst.slices // slices
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:  # noqa: N803
        gpu, inst = self._gi(gpuInstance)
        if inst.compute:
            raise _err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)  # one full-size CI per GI here
        handle = ctypes.pointer(pynvml.struct_c_nvmlComputeInstance_t())
        inst.compute[0] = (profileId, handle)
        # the MIG device the new compute instance makes visible, named as NVML names it
        inst.mig_uuid = f"MIG-{gpu.uuid[4:12]}-{inst.id:04x}-4000-8000-{inst.id:012x}"
        inst.mig_handle = ctypes.pointer(pynvml.struct_c_nvmlDevice_t())
        return handle

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:  # noqa: N803
        addr = ctypes.addressof(computeInstance.contents)
        for gpu in self.gpus:
            for inst in gpu.instances.values():
                for ci_id, (_pid, h) in list(inst.compute.items()):
                    if ctypes.addressof(h.contents) == addr:
                        if inst.id in gpu.busy_instances:
                            raise _err(pynvml.NVML_ERROR_IN_USE)
                        del inst.compute[ci_id]
                        inst.mig_uuid, inst.mig_handle = "", None
                        return pynvml.NVML_SUCCESS
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: Any, computeInstanceId: int) -> Any:  # noqa: N803
        _gpu, inst = self._gi(gpuInstance)
        got = inst.compute.get(computeInstanceId)
        if got is None:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return got[1]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._mig_gpu(device, "nvmlDeviceGetMaxMigDeviceCount", enabled=False)
        return _MIG_SLICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._mig_gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        devices = [i for _, i in sorted(gpu.instances.items()) if i.mig_handle is not None]
        if not 0 <= index < _MIG_SLICES:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(devices):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[index].mig_handle

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        got = self._mig_device(device)
        if got is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # not a MIG device handle
        return got[1].id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        got = self._mig_device(device)
        if got is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return next(iter(got[1].compute))

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

    driver_version = "550.54.15"

    def nvmlSystemGetDriverVersion(self) -> str:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.driver_version

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
        mig = self._mig_device(handle) if self.initialised else None
        if mig is not None:
            return mig[1].mig_uuid
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> pynvml.c_nvmlMemory_t:
        mig = self._mig_device(handle) if self.initialised else None
        if mig is not None:
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = mig[1].memory_mb * 1024 * 1024, 0, mig[1].memory_mb * 1024 * 1024
            return mem
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
