"""The container runtime interface (docker, sim) and the labels every gpucloud container has."""

from __future__ import annotations

from typing import Final, Protocol

from agents.protocol import DesiredContainer, ObservedContainer

__all__ = [
    "LABEL_INSTANCE",
    "LABEL_KIND",
    "LABEL_MANAGED",
    "LABEL_TENANT",
    "ContainerSpec",
    "ObservedContainer",
    "Runtime",
    "RuntimeError_",
    "container_name",
]

LABEL_MANAGED: Final = "gpucloud.managed"  # "1" on everything the agent creates
LABEL_INSTANCE: Final = "gpucloud.instance"
LABEL_TENANT: Final = "gpucloud.tenant"
LABEL_KIND: Final = "gpucloud.kind"

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


def container_name(instance_id: str) -> str:
    """One container per instance; the name makes a second create fail instead of duplicating."""
    return f"gpucloud-{instance_id}"
