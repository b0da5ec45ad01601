"""AMD GPUs through AMD SMI (the ``amdsmi`` Python package shipped with ROCm).

The module is injected (default ``import amdsmi``, which needs ``libamd_smi.so`` from
ROCm) so tests can pass a fake that keeps the real names and return shapes: most calls
return dicts, values a GPU cannot report come back as the string ``"N/A"``, and failures
raise ``AmdSmiLibraryException`` whose ``get_error_code()`` is an ``AMDSMI_STATUS_*``.

Failure policy mirrors ``nvml.py``: NOT_SUPPORTED leaves the field ``None``; a status
that means the device is gone (see ``_GONE``) marks the GPU unhealthy and stops probing
it this round; anything else is recorded in ``error``. ``sample()`` never raises.
AMD has no XID events; ``xid_events`` is always empty.

Units (AMD SMI docs): VRAM sizes and usage in MB (MiB), power in W, temperature in C,
activity in percent.
"""

from __future__ import annotations

import importlib
import logging
from itertools import combinations
from pathlib import Path
from typing import Any, Final

from agents.host.gpu import islands, normalise_bus_id, sysfs_numa_node
from agents.protocol import GpuInfo, GpuSample

logger = logging.getLogger(__name__)

# amdsmi_status_t values (amdsmi_wrapper.AMDSMI_STATUS_*), stable across ROCm 6.x/7.x.
STATUS_NOT_SUPPORTED: Final = 2
STATUS_NOT_YET_IMPLEMENTED: Final = 3
STATUS_DRM_ERROR: Final = 6
STATUS_IO: Final = 12
STATUS_NOT_FOUND: Final = 31
STATUS_AMDGPU_RESTART_ERR: Final = 54
_UNSUPPORTED: Final = frozenset({STATUS_NOT_SUPPORTED, STATUS_NOT_YET_IMPLEMENTED})
# The device stopped answering: driver lost it, it was reset, or it left the bus.
_GONE: Final = frozenset({STATUS_DRM_ERROR, STATUS_IO, STATUS_NOT_FOUND, STATUS_AMDGPU_RESTART_ERR})

LINK_TYPE_XGMI: Final = 2  # AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI


class _Gone(Exception):
    pass


def _num(value: Any) -> float | None:
    """AMD SMI returns "N/A" (or UINT max) for values a device cannot report."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
        return None
    return float(value)


def bdf_from_id(bdf_id: int) -> str:
    """Decode amdsmi_get_gpu_bdf_id(): domain[63:32] bus[15:8] device[7:3] function[2:0]."""
    domain, bus = (bdf_id >> 32) & 0xFFFF, (bdf_id >> 8) & 0xFF
    return f"{domain:04x}:{bus:02x}:{(bdf_id >> 3) & 0x1F:02x}.{bdf_id & 0x7:x}"


class AmdSmiBackend:
    name = "amdsmi"

    def __init__(self, smi: Any = None, *, sysfs_root: Path = Path("/sys")) -> None:
        if smi is None:
            smi = importlib.import_module("amdsmi")  # needs ROCm's libamd_smi.so
        self._smi = smi
        self._sysfs = sysfs_root
        self._smi.amdsmi_init()
        self._gpus: list[tuple[str, Any]] = []

    def _call(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self._smi, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._smi.AmdSmiLibraryException as e:
            code = e.get_error_code()
            if code in _UNSUPPORTED:
                return None
            if code in _GONE:
                raise _Gone(f"{fn_name}: {e}") from e
            raise

    def inventory(self) -> list[GpuInfo]:
        s = self._smi
        found: list[tuple[int, str, Any]] = []
        for index, handle in enumerate(s.amdsmi_get_processor_handles()):
            try:
                uuid = s.amdsmi_get_gpu_device_uuid(handle)
            except s.AmdSmiException as e:
                logger.error("gpu skipped: no uuid", extra={"gpu_index": index, "error": str(e)})
                continue
            found.append((index, uuid, handle))
        self._gpus = [(u, h) for _, u, h in found]

        links: set[tuple[str, str]] = set()
        for (_, ua, ha), (_, ub, hb) in combinations(found, 2):
            try:
                link = self._call("amdsmi_topo_get_link_type", ha, hb)
            except (_Gone, s.AmdSmiException):
                continue
            # Any xGMI path means the same hive (one fabric), which is what an island is.
            if link is not None and link.get("type") == LINK_TYPE_XGMI:
                links.add((ua, ub))
        island = islands([u for _, u, _ in found], links)
        peers: dict[str, list[str]] = {u: [] for _, u, _ in found}
        for a, b in links:
            peers[a].append(b)
            peers[b].append(a)

        out = []
        for index, uuid, handle in found:
            model, memory_mib, bus, numa = "AMD GPU", 0, None, None
            try:
                asic = self._call("amdsmi_get_gpu_asic_info", handle) or {}
                model = str(asic.get("market_name") or model)
                vram = self._call("amdsmi_get_gpu_vram_info", handle) or {}
                memory_mib = int(_num(vram.get("vram_size")) or 0)
                bdf_id = self._call("amdsmi_get_gpu_bdf_id", handle)
                bus = normalise_bus_id(bdf_from_id(bdf_id)) if bdf_id is not None else None
                numa = self._call("amdsmi_topo_get_numa_node_number", handle)
            except (_Gone, s.AmdSmiException) as e:
                logger.error("gpu inventory incomplete", extra={"gpu_uuid": uuid, "error": str(e)})
            if numa is None or numa < 0:
                numa = sysfs_numa_node(bus, self._sysfs)
            topo = {
                other: ("nvlink" if other in peers[uuid] else "system")
                for _, other, _ in found
                if other != uuid
            }
            out.append(
                GpuInfo(
                    uuid=uuid,
                    index=index,
                    model=model,
                    vendor="amd",
                    memory_mib=memory_mib,
                    pci_bus_id=bus,
                    numa_node=numa,
                    nvlink_island=island.get(uuid),
                    nvlink_peers=sorted(peers[uuid]),
                    topology=topo,
                    mig_mode=None,
                )
            )
        return out

    def sample(self) -> list[GpuSample]:
        if not self._gpus:
            self.inventory()
        return [self._sample_one(uuid, handle) for uuid, handle in self._gpus]

    def _sample_one(self, uuid: str, handle: Any) -> GpuSample:
        s = self._smi
        values: dict[str, Any] = {}
        errors: list[str] = []
        probes: list[tuple[str, str, tuple[Any, ...]]] = [
            ("activity", "amdsmi_get_gpu_activity", (handle,)),
            ("vram", "amdsmi_get_gpu_vram_usage", (handle,)),
            # MI300-class parts have no edge sensor; hotspot (junction) exists everywhere.
            (
                "temp",
                "amdsmi_get_temp_metric",
                (handle, s.AmdSmiTemperatureType.HOTSPOT, s.AmdSmiTemperatureMetric.CURRENT),
            ),
            ("power", "amdsmi_get_power_info", (handle,)),
            ("ecc", "amdsmi_get_gpu_total_ecc_count", (handle,)),
        ]
        for key, fn, args in probes:
            try:
                values[key] = self._call(fn, *args)
            except _Gone as e:
                return GpuSample(uuid=uuid, healthy=False, error=str(e))
            except Exception as e:  # noqa: BLE001 - one failing probe never kills the loop
                errors.append(f"{fn}: {e}")

        activity = values.get("activity") or {}
        vram = values.get("vram") or {}
        power = values.get("power") or {}
        ecc = values.get("ecc") or {}
        watts = None
        # socket_power on ROCm >= 6.2; older libraries fill current_ (MI300) or average_.
        for key in ("socket_power", "current_socket_power", "average_socket_power"):
            watts = _num(power.get(key))
            if watts:
                break
        used = _num(vram.get("vram_used"))
        corrected, uncorrected = (
            _num(ecc.get("correctable_count")),
            _num(ecc.get("uncorrectable_count")),
        )
        temp = _num(values.get("temp"))
        return GpuSample(
            uuid=uuid,
            healthy=True,
            error="; ".join(errors) or None,
            gpu_util=_num(activity.get("gfx_activity")),
            mem_util=_num(activity.get("umc_activity")),
            mem_used_mib=int(used) if used is not None else None,
            temperature_c=temp,
            power_w=watts,
            ecc_corrected=int(corrected) if corrected is not None else None,
            ecc_uncorrected=int(uncorrected) if uncorrected is not None else None,
            xid_events=[],
        )

    def close(self) -> None:
        try:
            self._smi.amdsmi_shut_down()
        except self._smi.AmdSmiException as e:
            logger.warning("amdsmi shutdown failed", extra={"error": str(e)})
