"""Simulated GPUs and a simulated container runtime, for laptops, demos and load tests.

Cheap enough to run hundreds of simulated hosts in one process: no threads, no I/O;
time comes from an injectable clock and randomness from a seeded ``random.Random``, so
a run is reproducible.

* ``SimGpuBackend``: N GPUs of a named model (realistic memory, power, topology). Their
  utilisation follows the containers the ``SimRuntime`` runs on them.
* ``SimRuntime``: fake containers. A job labelled ``gpucloud.sim.duration_s`` exits after
  that many (clock) seconds with ``gpucloud.sim.exit_code`` (default 0); instances run
  until stopped. A container's env ``GPUCLOUD_SIM_GPU_UTIL`` (0..100) sets its GPU load
  (a random 55..100 % otherwise). It refuses a start that would over-book a GPU (shares above 1000 milli),
  which turns a scheduler bug into a visible start error in end-to-end simulations.
  A signal (checkpoint-aware preemption) is recorded (``signals``, and a line in the
  container's log); a job that declared ``checkpoint_signal`` saves its progress on it, and
  its next run (a later attempt of the same workload) resumes from there: it runs only the
  rest of its ``duration_s``.
"""

from __future__ import annotations

import random
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from agents.host.gpu import FATAL_XIDS, islands
from agents.host.runtime import ContainerSpec, GpuLoad, Runtime, RuntimeError_, declared_gpu_load
from agents.protocol import GpuInfo, GpuSample, ObservedContainer

LABEL_SIM_DURATION: Final = "gpucloud.sim.duration_s"
LABEL_SIM_EXIT_CODE: Final = "gpucloud.sim.exit_code"
# The label every attempt of one workload shares (the control plane sets it): what a
# checkpoint belongs to, so a later attempt resumes from it.
LABEL_WORKLOAD: Final = "gpucloud.workload"

_NAMESPACE = uuidlib.UUID("6f1c9a52-3d7e-4b8a-9c0e-2f5d8e1a7b34")


@dataclass(frozen=True)
class SimModel:
    name: str  # the product name the real driver reports
    vendor: str
    memory_mib: int  # what NVML / AMD SMI report as total, not the marketing number
    idle_w: float
    max_w: float
    # "nvswitch": all GPUs one island; "pairs"/"quads": islands of 2/4; "pcie": no links.
    fabric: str


MODELS: Final[dict[str, SimModel]] = {
    "H100": SimModel("NVIDIA H100 80GB HBM3", "nvidia", 81559, 70.0, 700.0, "nvswitch"),
    "H200": SimModel("NVIDIA H200", "nvidia", 143771, 75.0, 700.0, "nvswitch"),
    "A100": SimModel("NVIDIA A100-SXM4-80GB", "nvidia", 81920, 55.0, 400.0, "nvswitch"),
    "A100-PCIE": SimModel("NVIDIA A100 80GB PCIe", "nvidia", 81920, 45.0, 300.0, "quads"),
    "L40S": SimModel("NVIDIA L40S", "nvidia", 46068, 35.0, 350.0, "pcie"),
    "MI300X": SimModel("AMD Instinct MI300X", "amd", 196592, 140.0, 750.0, "nvswitch"),
}


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# --- runtime ----------------------------------------------------------------------------


@dataclass
class _SimContainer:
    spec: ContainerSpec
    container_id: str
    started_at: float
    ends_at: float | None  # jobs only
    exit_code_on_end: int
    host_ports: dict[str, int]
    state: str = "running"
    exit_code: int | None = None
    finished_at: float | None = None
    log: list[str] = field(default_factory=list)
    load: float = 1.0  # 0..1, how hard it drives its GPUs
    resumed_from: float = 0.0  # seconds of its duration a checkpoint had saved


def _workload_of(spec: ContainerSpec) -> str:
    return spec.labels.get(LABEL_WORKLOAD) or spec.instance_id.split(".")[0]


class SimRuntime:
    """In-memory containers. Not thread-safe; one per simulated host."""

    name = "sim"

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
        fail_images: frozenset[str] = frozenset(),
    ) -> None:
        self._clock = clock
        self._rng = random.Random(seed)
        self._containers: dict[str, _SimContainer] = {}
        self._next_port = 30000
        self._fail_images = fail_images  # images whose "pull" fails, for error-path tests
        self.calls: list[tuple[str, str]] = []  # (operation, instance id), for tests
        # persistent volumes: name -> the instance ids that mounted it, in order (kept after they end)
        self.volumes: dict[str, list[str]] = {}
        self.volume_bytes: dict[str, int] = {}
        # checkpoint-aware preemption: (instance id, signal) in the order sent, and each
        # workload's saved progress (seconds of its duration done) for its next attempt
        self.signals: list[tuple[str, str]] = []
        self.checkpoints: dict[str, float] = {}

    def _tick(self) -> None:
        now = self._clock()
        for c in self._containers.values():
            if c.state == "running" and c.ends_at is not None and now >= c.ends_at:
                c.state, c.exit_code, c.finished_at = "exited", c.exit_code_on_end, c.ends_at
                c.log.append(f"job finished with exit code {c.exit_code}")

    def next_change_in(self) -> float | None:
        """Seconds until the next running job ends by itself; None if none will."""
        ends = [
            c.ends_at
            for c in self._containers.values()
            if c.state == "running" and c.ends_at is not None
        ]
        return max(0.0, min(ends) - self._clock()) if ends else None

    def gpu_load(self) -> GpuLoad:
        """GPU UUID -> [(milli, load)] of the running containers on it."""
        self._tick()
        out: GpuLoad = {}
        for c in self._containers.values():
            if c.state == "running":
                for u in c.spec.gpu_uuids:
                    out.setdefault(u, []).append((c.spec.gpu_milli, c.load))
        return out

    def run(self, spec: ContainerSpec) -> str:
        self.calls.append(("run", spec.instance_id))
        self._tick()
        existing = self._containers.get(spec.instance_id)
        if existing is not None and existing.state == "running":
            return existing.container_id
        if spec.image in self._fail_images:
            raise RuntimeError_(f"pull access denied for {spec.image}")
        booked = self.gpu_load()
        for u in spec.gpu_uuids:
            used = sum(m for m, _ in booked.get(u, []))
            if used + spec.gpu_milli > 1000:
                raise RuntimeError_(f"GPU {u} over-booked: {used} + {spec.gpu_milli} milli > 1000")
        now = self._clock()
        duration = spec.labels.get(LABEL_SIM_DURATION)
        saved = self.checkpoints.get(_workload_of(spec), 0.0) if spec.checkpoint_signal else 0.0
        ports = {}
        for p in spec.ports:
            ports[str(p)] = self._next_port
            self._next_port += 1
        c = _SimContainer(
            spec=spec,
            container_id=f"sim-{uuidlib.UUID(int=self._rng.getrandbits(128)).hex[:12]}",
            started_at=now,
            ends_at=now + max(0.0, float(duration) - saved) if duration is not None else None,
            exit_code_on_end=int(spec.labels.get(LABEL_SIM_EXIT_CODE, "0")),
            host_ports=ports,
            load=declared_gpu_load(spec.env, self._rng),
        )
        c.log.append(f"started {spec.image} {' '.join(spec.command)}".rstrip())
        if saved:
            c.log.append(f"resumed from checkpoint at {saved:g} s")
        c.resumed_from = saved
        for m in spec.mounts:
            self.volumes.setdefault(m.volume, []).append(spec.instance_id)
            c.log.append(f"mounted volume {m.volume} at {m.path}{' (read-only)' if m.read_only else ''}")
        self._containers[spec.instance_id] = c
        return c.container_id

    def volume_usage(self) -> dict[str, int]:
        """Simulated volumes hold nothing (tests set ``volume_bytes`` to say otherwise)."""
        return {name: self.volume_bytes.get(name, 0) for name in sorted(self.volumes)}

    def remove_volume(self, name: str) -> bool:
        self.calls.append(("remove_volume", name))
        self.volumes.pop(name, None)
        return True

    def stop(self, instance_id: str) -> None:
        self.calls.append(("stop", instance_id))
        self._tick()
        c = self._containers.get(instance_id)
        if c is None or c.state != "running":
            return
        # What `docker stop` reports for a process that exits on SIGTERM: 128 + 15.
        c.state, c.exit_code, c.finished_at = "exited", 143, self._clock()
        c.log.append("stopped")

    def signal(self, instance_id: str, signal: str) -> None:
        self.calls.append(("signal", instance_id))
        self._tick()
        c = self._containers.get(instance_id)
        if c is None or c.state != "running":
            return
        self.signals.append((instance_id, signal))
        if c.spec.checkpoint_signal == signal:
            done = c.resumed_from + self._clock() - c.started_at
            self.checkpoints[_workload_of(c.spec)] = done
            c.log.append(f"received {signal}; checkpoint saved at {done:g} s")
        else:
            c.log.append(f"received {signal}")

    def remove(self, instance_id: str) -> None:
        self.calls.append(("remove", instance_id))
        self._containers.pop(instance_id, None)

    def vanish(self, instance_id: str) -> None:
        """The container goes without the agent's order (``docker rm -f`` behind its back):
        for tests of what the agent then reports."""
        self._containers.pop(instance_id, None)

    def list(self) -> list[ObservedContainer]:
        self._tick()
        return [
            ObservedContainer(
                instance_id=iid,
                container_id=c.container_id,
                state="running" if c.state == "running" else "exited",
                exit_code=c.exit_code,
                started_at=_iso(c.started_at),
                finished_at=_iso(c.finished_at),
                host_ports=dict(c.host_ports),
            )
            for iid, c in sorted(self._containers.items())
        ]

    def logs(self, instance_id: str, tail: int = 100) -> str:
        c = self._containers.get(instance_id)
        if c is None:
            return ""
        return "\n".join(c.log[-tail:] if tail > 0 else c.log)


# --- GPUs -------------------------------------------------------------------------------


class SimGpuBackend:
    """``count`` GPUs of ``model`` whose load follows ``runtime``'s running containers
    (``Runtime.gpu_load``: the simulated runtime's, or the Docker engine's in the demo)."""

    name = "sim"

    def __init__(
        self,
        *,
        model: str = "H100",
        count: int = 8,
        hostname: str = "sim-host",
        seed: int = 0,
        runtime: Runtime | None = None,
    ) -> None:
        if model not in MODELS:
            raise ValueError(f"unknown sim model {model!r}; choose from {sorted(MODELS)}")
        if count < 0:
            raise ValueError("count must be >= 0")
        self.model = MODELS[model]
        self.count = count
        self.runtime = runtime
        self._rng = random.Random(seed)
        prefix = "GPU-" if self.model.vendor == "nvidia" else ""
        # Stable across restarts and unique across simulated hosts in one process.
        self.uuids = [
            f"{prefix}{uuidlib.uuid5(_NAMESPACE, f'{hostname}/{i}')}" for i in range(count)
        ]
        self._lost: dict[str, str] = {}
        self._xids: dict[str, list[int]] = {}

    # failure injection, for tests and chaos demos
    def lose(self, uuid: str, error: str = "GPU is lost") -> None:
        self._lost[uuid] = error

    def inject_xid(self, uuid: str, xid: int) -> None:
        self._xids.setdefault(uuid, []).append(xid)

    def _links(self) -> list[tuple[str, str]]:
        u, fabric = self.uuids, self.model.fabric
        size = {"nvswitch": len(u), "quads": 4, "pairs": 2}.get(fabric, 0)
        if size < 2:
            return []
        return [
            (u[i], u[j])
            for i in range(len(u))
            for j in range(i + 1, len(u))
            if i // size == j // size
        ]

    def inventory(self) -> list[GpuInfo]:
        links = self._links()
        island = islands(self.uuids, links)
        peers: dict[str, list[str]] = {u: [] for u in self.uuids}
        for a, b in links:
            peers[a].append(b)
            peers[b].append(a)
        half = max(1, (self.count + 1) // 2)
        out = []
        for i, u in enumerate(self.uuids):
            topo = {}
            for j, v in enumerate(self.uuids):
                if v == u:
                    continue
                if v in peers[u]:
                    topo[v] = "nvlink"
                elif i // half == j // half:
                    topo[v] = "numa_node"
                else:
                    topo[v] = "system"
            out.append(
                GpuInfo(
                    uuid=u,
                    index=i,
                    model=self.model.name,
                    vendor=self.model.vendor,
                    memory_mib=self.model.memory_mib,
                    pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
                    numa_node=i // half,
                    nvlink_island=island.get(u),
                    nvlink_peers=sorted(peers[u]),
                    topology=topo,
                    mig_mode=False if self.model.vendor == "nvidia" else None,
                )
            )
        return out

    def sample(self) -> list[GpuSample]:
        load = self.runtime.gpu_load() if self.runtime is not None else {}
        m = self.model
        out = []
        for u in self.uuids:
            if u in self._lost:
                out.append(GpuSample(uuid=u, healthy=False, error=self._lost[u]))
                continue
            busy = sum(milli / 1000 * f for milli, f in load.get(u, []))
            noise = self._rng.uniform(-3.0, 3.0) if busy else self._rng.uniform(0.0, 0.5)
            util = round(min(100.0, max(0.0, busy * 100 + noise)), 1)
            mem_used = int(
                min(1.0, sum(milli / 1000 for milli, _ in load.get(u, []))) * m.memory_mib * 0.85
            )
            xids, self._xids[u] = self._xids.get(u, []), []
            out.append(
                GpuSample(
                    uuid=u,
                    healthy=not any(x in FATAL_XIDS for x in xids),
                    error=f"XID {xids[-1]}" if xids else None,
                    gpu_util=util,
                    mem_util=round(util * 0.6, 1),
                    mem_used_mib=mem_used + 512,
                    temperature_c=round(32 + util * 0.45, 1),
                    power_w=round(m.idle_w + (m.max_w - m.idle_w) * util / 100, 1),
                    ecc_corrected=0,
                    ecc_uncorrected=0,
                    xid_events=xids,
                )
            )
        return out

    def close(self) -> None:
        pass
