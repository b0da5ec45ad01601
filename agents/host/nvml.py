"""NVIDIA GPUs through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package).

The module is injected (default ``import pynvml``) so tests can pass a fake that keeps
pynvml's names, return types and exception classes.

Failure policy, per probe: ``NVMLError_NotSupported`` (and a missing function in an old
driver) means "this GPU cannot tell": the field stays ``None``. ``NVMLError_GpuIsLost``
means the GPU fell off the bus: it is reported ``healthy=False`` with the error and no
further probe touches it this round. Any other error is recorded in ``error`` and the
other probes go on. Nothing here raises out of ``sample()``.

MIG (Multi-Instance GPU, A100/H100-class parts): ``inventory()`` reports each GPU's MIG
devices (``MIG-...`` UUIDs, profile, slices, memory) when MIG mode is on;
``mig_profiles()``, ``create_mig_device()`` and ``destroy_mig_device()`` discover the GPU
instance profiles and create / destroy a GPU instance with one full-size compute
instance, through NVML's own calls (the operator enables MIG mode itself: it needs a
GPU reset). A container is pinned to a MIG device by its ``MIG-...`` UUID, as to a GPU.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, Final

from agents.host.gpu import FATAL_XIDS, islands, normalise_bus_id, sysfs_numa_node
from agents.protocol import GpuInfo, GpuSample, MigDevice

logger = logging.getLogger(__name__)

_MIB: Final = 1024 * 1024
_MAX_EVENTS_PER_SAMPLE: Final = 256  # a storm of XIDs must not stall the heartbeat

# nvmlGpuTopologyLevel_t values -> protocol TOPOLOGY_LEVELS names.
_TOPOLOGY_NAMES: Final[dict[int, str]] = {
    0: "board",  # NVML_TOPOLOGY_INTERNAL
    10: "pcie_switch",  # NVML_TOPOLOGY_SINGLE
    20: "pcie_switches",  # NVML_TOPOLOGY_MULTIPLE
    30: "host_bridge",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "numa_node",  # NVML_TOPOLOGY_NODE (== NVML_TOPOLOGY_CPU)
    50: "system",  # NVML_TOPOLOGY_SYSTEM
}


# GPU instance slices -> the nvmlComputeInstanceProfile that fills a GPU instance of them.
_CI_PROFILE_NAMES: Final[dict[int, str]] = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile a GPU supports (``nvmlDeviceGetGpuInstanceProfileInfoV``).

    ``profile`` is the NVML enum (``NVML_GPU_INSTANCE_PROFILE_1_SLICE``...) that
    ``create_mig_device`` takes; ``id`` the profile id NVML creates instances with.
    """

    profile: int
    id: int
    name: str  # "1g.10gb"
    slices: int
    memory_mib: int
    instances: int  # how many fit on an empty GPU


def _text(value: str | bytes) -> str:
    # pynvml decodes char arrays for most calls (convertStrBytes) but not struct fields.
    return value.decode() if isinstance(value, bytes) else str(value)


class _Lost(Exception):
    """Internal: the GPU under probe is lost; stop probing it."""


class NvmlBackend:
    name = "nvml"

    def __init__(self, nvml: Any = None, *, sysfs_root: Path = Path("/sys")) -> None:
        if nvml is None:
            # importlib keeps mypy strict clean without stubs for pynvml.
            nvml = importlib.import_module("pynvml")
        self._nvml = nvml
        self._sysfs = sysfs_root
        # NVMLError_LibraryNotFound / DriverNotLoaded here is a setup error: let it raise.
        self._nvml.nvmlInit()
        self._gpus: list[tuple[str, Any]] = []  # (uuid, handle), from inventory()
        self._events: Any = None

    # --- helpers ------------------------------------------------------------------------

    def _optional(self, fn_name: str, *args: Any) -> Any:
        """Call an NVML function; None when unsupported here; _Lost when the GPU is gone."""
        n = self._nvml
        fn = getattr(n, fn_name, None)
        if fn is None:
            return None  # older pynvml without this binding
        try:
            return fn(*args)
        except n.NVMLError_GpuIsLost as e:
            raise _Lost(str(e)) from e
        except (n.NVMLError_NotSupported, n.NVMLError_FunctionNotFound):
            return None

    # --- inventory ----------------------------------------------------------------------

    def inventory(self) -> list[GpuInfo]:
        n = self._nvml
        gpus: list[tuple[int, str, Any]] = []
        for index in range(n.nvmlDeviceGetCount()):
            try:
                handle = n.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(n.nvmlDeviceGetUUID(handle))
            except n.NVMLError as e:
                # Without a UUID the GPU cannot be named (GPUs are never named by index alone).
                logger.error("gpu skipped: no uuid", extra={"gpu_index": index, "error": str(e)})
                continue
            gpus.append((index, uuid, handle))
        self._gpus = [(u, h) for _, u, h in gpus]
        self._register_events()

        by_bus: dict[str, str] = {}
        facts: dict[str, dict[str, Any]] = {}
        for index, uuid, handle in gpus:
            f: dict[str, Any] = {"index": index, "model": "unknown", "memory_mib": 0}
            try:
                f["model"] = _text(n.nvmlDeviceGetName(handle))
                f["memory_mib"] = int(n.nvmlDeviceGetMemoryInfo(handle).total // _MIB)
                pci = self._optional("nvmlDeviceGetPciInfo", handle)
                f["bus"] = normalise_bus_id(pci.busId) if pci is not None else None
                numa = self._optional("nvmlDeviceGetNumaNodeId", handle)
                f["numa"] = (
                    numa
                    if numa is not None and numa >= 0
                    else sysfs_numa_node(f["bus"], self._sysfs)
                )
                mig = self._optional("nvmlDeviceGetMigMode", handle)
                f["mig"] = None if mig is None else bool(mig[0] == n.NVML_DEVICE_MIG_ENABLE)
                if f["mig"]:
                    f["mig_devices"] = self._mig_devices(handle)
                f["remote"] = self._nvlink_remotes(handle)
            except (_Lost, n.NVMLError) as e:
                logger.error("gpu inventory incomplete", extra={"gpu_uuid": uuid, "error": str(e)})
            facts[uuid] = f
            if f.get("bus"):
                by_bus[f["bus"]] = uuid

        # NVLink peers: a link whose far end is another GPU's bus id is a direct link;
        # a link to anything else is an NVSwitch, and all switch-attached GPUs of a host
        # share one fabric (HGX boards have one NVSwitch plane).
        links: set[tuple[str, str]] = set()
        switched = []
        for uuid, f in facts.items():
            remotes = f.get("remote") or []
            if any(r not in by_bus for r in remotes):
                switched.append(uuid)
            for r in remotes:
                if r in by_bus and by_bus[r] != uuid:
                    links.add(tuple(sorted((uuid, by_bus[r]))))  # type: ignore[arg-type]
        links.update(combinations(switched, 2))
        island = islands([u for _, u, _ in gpus], links)

        peers: dict[str, set[str]] = {u: set() for _, u, _ in gpus}
        for a, b in links:
            peers[a].add(b)
            peers[b].add(a)

        out = []
        handles = {u: h for _, u, h in gpus}
        for index, uuid, handle in gpus:
            f = facts[uuid]
            topo: dict[str, str] = {}
            for other, other_handle in handles.items():
                if other == uuid:
                    continue
                if other in peers[uuid]:
                    topo[other] = "nvlink"
                    continue
                try:
                    level = self._optional(
                        "nvmlDeviceGetTopologyCommonAncestor", handle, other_handle
                    )
                except (_Lost, n.NVMLError):
                    level = None
                if level is not None and level in _TOPOLOGY_NAMES:
                    topo[other] = _TOPOLOGY_NAMES[level]
            out.append(
                GpuInfo(
                    uuid=uuid,
                    index=index,
                    model=f["model"],
                    vendor="nvidia",
                    memory_mib=f["memory_mib"],
                    pci_bus_id=f.get("bus"),
                    numa_node=f.get("numa"),
                    nvlink_island=island.get(uuid),
                    nvlink_peers=sorted(peers[uuid]),
                    topology=topo,
                    mig_mode=f.get("mig"),
                    mig_devices=f.get("mig_devices", []),
                )
            )
        return out

    # --- MIG ----------------------------------------------------------------------------

    def _handle(self, gpu_uuid: str) -> Any:
        if not self._gpus:
            self.inventory()
        for uuid, handle in self._gpus:
            if uuid == gpu_uuid:
                return handle
        raise KeyError(f"no GPU {gpu_uuid} on this host")

    def _profiles(self, handle: Any) -> list[MigProfile]:
        n = self._nvml
        out = []
        for profile in range(int(getattr(n, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
            info = self._optional("nvmlDeviceGetGpuInstanceProfileInfoV", handle, profile)
            if info is None or not info.instanceCount:
                continue  # a profile this part does not have
            name = _text(info.name).removeprefix("MIG ").strip()
            out.append(
                MigProfile(
                    profile=profile,
                    id=int(info.id),
                    name=name,
                    slices=int(info.sliceCount),
                    memory_mib=int(info.memorySizeMB),
                    instances=int(info.instanceCount),
                )
            )
        return out

    def mig_profiles(self, gpu_uuid: str) -> list[MigProfile]:
        """The GPU instance profiles of a GPU; [] on a part without MIG."""
        return self._profiles(self._handle(gpu_uuid))

    def _mig_devices(self, handle: Any) -> list[MigDevice]:
        """The MIG devices of a GPU in MIG mode, in NVML's index order."""
        n = self._nvml
        count = self._optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        by_id = {p.id: p for p in self._profiles(handle)}
        out = []
        for index in range(int(count)):
            try:
                mig = n.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except n.NVMLError_NotFound:
                continue  # an empty slot: NVML numbers slots, not devices
            gi_id = int(n.nvmlDeviceGetGpuInstanceId(mig))
            gi = n.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            profile = by_id.get(int(n.nvmlGpuInstanceGetInfo(gi).profileId))
            out.append(
                MigDevice(
                    uuid=_text(n.nvmlDeviceGetUUID(mig)),
                    gpu_instance_id=gi_id,
                    compute_instance_id=int(n.nvmlDeviceGetComputeInstanceId(mig)),
                    profile=profile.name if profile else "",
                    slices=profile.slices if profile else 1,
                    memory_mib=int(n.nvmlDeviceGetMemoryInfo(mig).total // _MIB),
                )
            )
        return out

    def mig_devices(self, gpu_uuid: str) -> list[MigDevice]:
        """The MIG devices of a GPU now ([] when MIG mode is off or unsupported)."""
        handle = self._handle(gpu_uuid)
        mode = self._optional("nvmlDeviceGetMigMode", handle)
        if mode is None or mode[0] != self._nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        return self._mig_devices(handle)

    def create_mig_device(self, gpu_uuid: str, profile: int) -> MigDevice:
        """Create a GPU instance of ``profile`` (an ``NVML_GPU_INSTANCE_PROFILE_*`` enum)
        with one compute instance filling it; returns the new MIG device.

        Raises the NVML error: ``NVMLError_NotSupported`` on a part without MIG or with
        MIG mode off, ``NVMLError_InsufficientResources`` when the GPU has no room left.
        A compute instance that cannot be created takes its GPU instance with it.
        """
        n = self._nvml
        handle = self._handle(gpu_uuid)
        info = n.nvmlDeviceGetGpuInstanceProfileInfoV(handle, profile)
        gi = n.nvmlDeviceCreateGpuInstance(handle, info.id)
        try:
            ci_profile = getattr(n, _CI_PROFILE_NAMES[int(info.sliceCount)])
            ci_info = n.nvmlGpuInstanceGetComputeInstanceProfileInfoV(
                gi, ci_profile, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            n.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        except BaseException:
            n.nvmlGpuInstanceDestroy(gi)
            raise
        gi_id = int(n.nvmlGpuInstanceGetInfo(gi).id)
        for dev in self._mig_devices(handle):
            if dev.gpu_instance_id == gi_id:
                logger.info("mig device created", extra={"gpu_uuid": gpu_uuid, "mig_uuid": dev.uuid})
                return dev
        raise RuntimeError(f"MIG device of GPU instance {gi_id} on {gpu_uuid} did not appear")

    def destroy_mig_device(self, gpu_uuid: str, mig_uuid: str) -> None:
        """Destroy a MIG device's compute instance and GPU instance. ``NVMLError_InUse``
        while a process runs on it; a device already gone is not an error."""
        n = self._nvml
        handle = self._handle(gpu_uuid)
        dev = next((d for d in self.mig_devices(gpu_uuid) if d.uuid == mig_uuid), None)
        if dev is None:
            return
        gi = n.nvmlDeviceGetGpuInstanceById(handle, dev.gpu_instance_id)
        ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, dev.compute_instance_id)
        n.nvmlComputeInstanceDestroy(ci)
        n.nvmlGpuInstanceDestroy(gi)
        logger.info("mig device destroyed", extra={"gpu_uuid": gpu_uuid, "mig_uuid": mig_uuid})

    def _nvlink_remotes(self, handle: Any) -> list[str]:
        """Bus ids at the far end of each active NVLink of this GPU."""
        n = self._nvml
        remotes = []
        for link in range(int(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = n.nvmlDeviceGetNvLinkState(handle, link)
            except n.NVMLError_GpuIsLost:
                raise
            except n.NVMLError:
                # NotSupported: no NVLink on this GPU; InvalidArgument: past its last link.
                if link == 0:
                    return []
                break
            if active != n.NVML_FEATURE_ENABLED:
                continue
            try:
                bus = normalise_bus_id(n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except n.NVMLError_GpuIsLost:
                raise
            except n.NVMLError:
                continue
            if bus:
                remotes.append(bus)
        return remotes

    def _register_events(self) -> None:
        n = self._nvml
        try:
            self._events = n.nvmlEventSetCreate()
        except n.NVMLError as e:
            logger.warning("xid events unavailable", extra={"error": str(e)})
            self._events = None
            return
        for uuid, handle in self._gpus:
            try:
                n.nvmlDeviceRegisterEvents(handle, n.nvmlEventTypeXidCriticalError, self._events)
            except n.NVMLError as e:
                # NotSupported on some boards (and under vGPU); the other probes still work.
                logger.info("xid events not supported", extra={"gpu_uuid": uuid, "error": str(e)})

    def _drain_xids(self) -> dict[str, list[int]]:
        """XID events that arrived since the last call, by GPU UUID. Never blocks."""
        n = self._nvml
        out: dict[str, list[int]] = {}
        if self._events is None:
            return out
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = n.nvmlEventSetWait(self._events, 0)
            except n.NVMLError_Timeout:
                break  # nothing pending
            except n.NVMLError as e:
                logger.warning("xid event wait failed", extra={"error": str(e)})
                break
            if data.eventType != n.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = _text(n.nvmlDeviceGetUUID(data.device))
            except n.NVMLError:
                continue
            out.setdefault(uuid, []).append(int(data.eventData))
        return out

    # --- samples ------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        if not self._gpus:
            self.inventory()
        xids = self._drain_xids()
        return [self._sample_one(uuid, handle, xids.get(uuid, [])) for uuid, handle in self._gpus]

    def _sample_one(self, uuid: str, handle: Any, xids: list[int]) -> GpuSample:
        n = self._nvml
        values: dict[str, Any] = {}
        errors: list[str] = []

        probes: list[tuple[str, str, tuple[Any, ...]]] = [
            ("util", "nvmlDeviceGetUtilizationRates", (handle,)),
            ("mem", "nvmlDeviceGetMemoryInfo", (handle,)),
            ("temp", "nvmlDeviceGetTemperature", (handle, n.NVML_TEMPERATURE_GPU)),
            ("power_mw", "nvmlDeviceGetPowerUsage", (handle,)),
            (
                "ecc_c",
                "nvmlDeviceGetTotalEccErrors",
                (handle, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ),
            (
                "ecc_u",
                "nvmlDeviceGetTotalEccErrors",
                (handle, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            ),
        ]
        for key, fn, args in probes:
            try:
                values[key] = self._optional(fn, *args)
            except _Lost as e:
                return GpuSample(uuid=uuid, healthy=False, error=f"{fn}: {e}", xid_events=xids)
            except Exception as e:  # noqa: BLE001 - one failing probe never kills the loop
                errors.append(f"{fn}: {e}")

        fatal = [x for x in xids if x in FATAL_XIDS]
        if fatal:
            errors.append(f"fatal XID {fatal[-1]}")
        util, mem = values.get("util"), values.get("mem")
        power = values.get("power_mw")
        temp = values.get("temp")
        return GpuSample(
            uuid=uuid,
            healthy=not fatal,
            error="; ".join(errors) or None,
            gpu_util=float(util.gpu) if util is not None else None,
            mem_util=float(util.memory) if util is not None else None,
            mem_used_mib=int(mem.used // _MIB) if mem is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=round(power / 1000.0, 3) if power is not None else None,
            ecc_corrected=values.get("ecc_c"),
            ecc_uncorrected=values.get("ecc_u"),
            xid_events=xids,
        )

    def close(self) -> None:
        n = self._nvml
        try:
            if self._events is not None:
                n.nvmlEventSetFree(self._events)
                self._events = None
            n.nvmlShutdown()
        except n.NVMLError as e:
            logger.warning("nvml shutdown failed", extra={"error": str(e)})
