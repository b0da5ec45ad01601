"""The container runtime interface (docker, sim) and the labels every gpucloud container has."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Final, Protocol

from agents.protocol import DesiredContainer, ObservedContainer, utilisation_fraction

__all__ = [
    "LABEL_INSTANCE",
    "LABEL_KIND",
    "LABEL_MANAGED",
    "LABEL_TENANT",
    "ENV_SIM_GPU_UTIL",
    "LABEL_GPU_MILLI",
    "ContainerSpec",
    "GpuLoad",
    "ObservedContainer",
    "Runtime",
    "RuntimeError_",
    "container_name",
    "declared_gpu_load",
]

LABEL_MANAGED: Final = "gpucloud.managed"  # "1" on everything the agent creates
LABEL_INSTANCE: Final = "gpucloud.instance"
LABEL_TENANT: Final = "gpucloud.tenant"
LABEL_KIND: Final = "gpucloud.kind"
# The share of each of its GPUs a container was given (milli, 1000 = whole), so a runtime can
# say what it asks of its GPUs without the control plane's desired state at hand.
LABEL_GPU_MILLI: Final = "gpucloud.gpu_milli"

# A container's env may set how hard it drives its simulated GPUs, 0..100 (percent): tests and
# the demo drive utilisation with it (0: idle, for idle auto-stop). Without it the load is
# random. Real GPUs measure their load; only the simulated backend asks a runtime for this.
ENV_SIM_GPU_UTIL: Final = "GPUCLOUD_SIM_GPU_UTIL"

# GPU UUID -> [(milli, load 0..1)] of the running containers on it.
GpuLoad = dict[str, list[tuple[int, float]]]


def declared_gpu_load(env: Mapping[str, str], rng: random.Random) -> float:
    """A container's simulated GPU load 0..1: its GPUCLOUD_SIM_GPU_UTIL percent, else random
    0.55..1 (drawn from ``rng``, which the caller seeds per container so the load is stable)."""
    given = env.get(ENV_SIM_GPU_UTIL)
    if given is not None:
        try:
            return utilisation_fraction(float(given))
        except ValueError:
            pass
    return 0.55 + 0.45 * rng.random()

# What the runtime runs is exactly what the control plane asked for.
ContainerSpec = DesiredContainer


class RuntimeError_(Exception):  # noqa: N801 - avoid shadowing the builtin RuntimeError
    """A runtime operation failed (image pull, engine down, capacity check...)."""


class Runtime(Protocol):
    """Runs gpucloud containers on this host, addressed by instance id.

    ``run`` is idempotent for a running container (returns its id) and replaces a stale
    non-running one. ``stop`` and ``remove`` are idempotent: an unknown instance is a no-op.
    ``list`` returns only gpucloud-labelled containers, never ``missing`` ones.
    ``signal`` sends a signal (a name from ``agents.protocol.CHECKPOINT_SIGNALS``) to a running
    container's main process, for checkpoint-aware preemption; an unknown instance is a no-op.
    A runtime may also have ``notes`` (instance id -> text): what the owner should read of
    how its container runs (the Docker runtime's stand-in image); the agent reports them.
    """

    name: str

    def run(self, spec: ContainerSpec) -> str: ...

    def stop(self, instance_id: str) -> None: ...

    def signal(self, instance_id: str, signal: str) -> None: ...

    def remove(self, instance_id: str) -> None: ...

    def list(self) -> list[ObservedContainer]: ...

    def logs(self, instance_id: str, tail: int = 100) -> str: ...

    def gpu_load(self) -> GpuLoad:
        """What the running containers ask of their GPUs (``declared_gpu_load``): the simulated
        GPU backend's utilisation follows it, whichever runtime runs the containers."""
        ...


def container_name(instance_id: str) -> str:
    """One container per instance; the name makes a second create fail instead of duplicating."""
    return f"gpucloud-{instance_id}"
