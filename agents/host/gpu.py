"""The GPU backend interface and helpers shared by the nvml, amdsmi and sim backends."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from agents.protocol import FATAL_XIDS, GpuInfo, GpuSample

__all__ = [
    "FATAL_XIDS",
    "GpuBackend",
    "GpuInfo",
    "GpuSample",
    "islands",
    "normalise_bus_id",
    "sysfs_numa_node",
]

class GpuBackend(Protocol):
    """One vendor's view of this host's GPUs.

    ``inventory()`` is called once at start (and before registering); ``sample()`` every
    heartbeat. ``sample()`` must not raise for a single bad GPU: it reports that GPU with
    ``healthy=False`` and an ``error`` instead.
    """

    name: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


def normalise_bus_id(bus_id: str | bytes | None) -> str | None:
    """NVML's "00000000:3B:00.0" or AMD's "0000:3b:00.0" -> sysfs "0000:3b:00.0"."""
    if bus_id is None:
        return None
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    text = text.strip().strip("\x00").lower()
    if not text:
        return None
    parts = text.split(":")
    if len(parts) == 3:
        # NVML pads the PCI domain to 8 hex digits; sysfs uses 4.
        domain = parts[0][-4:].rjust(4, "0")
        return f"{domain}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1]}"
    return text


def sysfs_numa_node(bus_id: str | None, sysfs_root: Path = Path("/sys")) -> int | None:
    """NUMA node of a PCI device from sysfs, or None (unknown, or -1: no NUMA affinity)."""
    if not bus_id:
        return None
    try:
        value = int((sysfs_root / "bus/pci/devices" / bus_id / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def islands(uuids: Iterable[str], links: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Connected components of the NVLink/xGMI graph, numbered 0.. by their first UUID.

    GPUs with no link at all get no island (absent from the result).
    """
    order = list(uuids)
    parent = {u: u for u in order}

    def find(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    linked: set[str] = set()
    for a, b in links:
        if a not in parent or b not in parent or a == b:
            continue
        linked.update((a, b))
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb, key=order.index)] = min(ra, rb, key=order.index)
    ids: dict[str, int] = {}
    result: dict[str, int] = {}
    for u in order:
        if u in linked:
            result[u] = ids.setdefault(find(u), len(ids))
    return result
