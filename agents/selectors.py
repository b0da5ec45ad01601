"""Reads for the agent API: who a host token belongs to, and what should run on a host.

Container ids sent to agents are *attempt* ids, `<workload id>.<allocation id>`: the
id of the workload's first active allocation on that host. A job that failed and was
placed again gets new allocations, hence a new id, so a remembered exit of the previous
attempt (the agent keeps those, see docs/agent.md) can never end the new one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import defaultdict
from uuid import UUID

from django.conf import settings

from agents.models import Host
from agents.protocol import DesiredContainer
from scheduler.choices import State
from scheduler.models import Allocation, Workload

# Workload states whose container the agent must run. STOPPING is absent on purpose:
# leaving the desired set is how the agent learns to stop a container.
DESIRED_STATES = (State.SCHEDULED, State.STARTING, State.RUNNING)

LABEL_WORKLOAD = "gpucloud.workload"
LABEL_NAME = "gpucloud.name"
# Simulation hooks: a workload's env may say how long its simulated container runs and
# how it ends (`agents.host.sim`). Real runtimes ignore these labels.
SIM_ENV_LABELS = {
    "GPUCLOUD_SIM_DURATION_S": "gpucloud.sim.duration_s",
    "GPUCLOUD_SIM_EXIT_CODE": "gpucloud.sim.exit_code",
}


def hash_token(raw: str) -> str:
    """SHA-256 hex of a secret. Tokens are 256-bit random, so no slow KDF is needed."""
    return hashlib.sha256(raw.encode()).hexdigest()


def host_by_token(*, raw: str) -> Host | None:
    """The host whose token is `raw`, or None."""
    if not raw:
        return None
    digest = hash_token(raw)
    host = Host.objects.filter(token_hash=digest).first()
    if host is None or not hmac.compare_digest(host.token_hash, digest):
        return None
    return host


def attempt_id(workload_id: UUID | str, allocation_id: int) -> str:
    return f"{workload_id}.{allocation_id}"


def tenant_network(tenant_id: UUID | str) -> str:
    """The tenant's bridge network on every host: tenants never share one."""
    return f"gpucloud-t-{tenant_id}"


def host_attempts(*, host: Host, states: tuple[str, ...] | None = None) -> dict[str, Workload]:
    """Attempt id -> workload, for the workloads holding an active allocation on `host`."""
    rows = Allocation.objects.filter(host=host, active=True).select_related("workload")
    if states is not None:
        rows = rows.filter(workload__state__in=states)
    first: dict[UUID, int] = {}
    workloads: dict[UUID, Workload] = {}
    for a in rows.order_by("id"):
        first.setdefault(a.workload_id, a.pk)
        workloads[a.workload_id] = a.workload
    return {attempt_id(wid, first[wid]): workloads[wid] for wid in first}


def host_desired_containers(*, host: Host) -> list[DesiredContainer]:
    """The whole desired set of `host` (the heartbeat answer). One query."""
    rows = (
        Allocation.objects.filter(host=host, active=True, workload__state__in=DESIRED_STATES)
        .select_related("workload__instance_type", "gpu")
        .order_by("workload_id", "id")
    )
    grouped: dict[UUID, list[Allocation]] = defaultdict(list)
    for a in rows:
        grouped[a.workload_id].append(a)
    out = []
    for allocations in grouped.values():
        w = allocations[0].workload
        it = w.instance_type
        # The host's CPU and memory booking rides on the allocation rows (the scheduler puts
        # it on the first GPU's row); fall back to the instance type for hand-made rows.
        vcpus = sum(a.vcpus for a in allocations) or it.vcpus
        memory_mib = sum(a.memory_mib for a in allocations) or it.memory_gib * 1024
        gpus = sorted(allocations, key=lambda a: a.gpu.index)
        labels = {LABEL_WORKLOAD: str(w.pk), LABEL_NAME: w.name[:63]}
        for env_name, label in SIM_ENV_LABELS.items():
            if env_name in w.env:
                labels[label] = str(w.env[env_name])
        out.append(
            DesiredContainer(
                instance_id=attempt_id(w.pk, allocations[0].pk),
                tenant_id=str(w.tenant_id),
                kind=w.kind,
                image=w.image,
                command=[str(c) for c in w.command],
                env={str(k): str(v) for k, v in w.env.items()},
                ports=[int(p) for p in w.ports],
                gpu_uuids=[a.gpu_id for a in gpus],
                gpu_milli=allocations[0].milli,
                vcpus=float(vcpus),
                memory_mib=int(memory_mib),
                pids_limit=settings.AGENT_PIDS_LIMIT,
                network=tenant_network(w.tenant_id),
                labels=labels,
            )
        )
    return out
