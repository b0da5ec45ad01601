"""Synthetic fleets and queues, and the core benchmark.

    python -m scheduler.core.bench 100000 50000

The lead wires ``run_core_bench`` into ``manage.py bench_scheduler``. Everything is
seeded, so two runs plan the same thing; only the timings differ.
"""

from __future__ import annotations

import random
import resource
import sys
import time
import tracemalloc
from typing import Any

from .model import (
    WHOLE,
    Allocation,
    Billing,
    ClusterSnapshot,
    GpuView,
    HostPlacement,
    HostView,
    Kind,
    PlacementRequest,
    Priority,
    QuotaRule,
    TenantView,
)
from .planner import plan
from .policy import Policy, get_policy

#: model -> (share of the fleet, GPUs per NVLink island)
MODELS: dict[str, tuple[float, int]] = {
    "H100": (0.4, 8),
    "A100": (0.3, 8),
    "L40S": (0.2, 4),
    "A10": (0.1, 2),
}
REGIONS = ("eu-west", "us-east", "us-west")
GPUS_PER_HOST = 8
VCPUS_PER_HOST = 192
MEM_PER_HOST = 2048 * 1024  # 2 TiB
N_TENANTS = 200


def _pick(rng: random.Random, table: dict[str, float]) -> str:
    x = rng.random() * sum(table.values())
    for k, w in table.items():
        x -= w
        if x <= 0:
            return k
    return next(reversed(table))


def synthetic_fleet(gpus: int, seed: int = 0, load: float = 0.3) -> ClusterSnapshot:
    """``gpus // 8`` hosts of 8 GPUs over several models and regions; about
    ``load`` of the GPUs already held by running work (whole and shared)."""
    rng = random.Random(seed)
    hosts: list[HostView] = []
    allocs: list[Allocation] = []
    shares = {m: s for m, (s, _i) in MODELS.items()}
    n_hosts = max(1, gpus // GPUS_PER_HOST)
    classes: dict[str, float] = {"critical": 0.1, "standard": 0.6, "low": 0.3}
    for h in range(n_hosts):
        model = _pick(rng, shares)
        island = MODELS[model][1]
        region = REGIONS[h % len(REGIONS)]
        host_id = f"h{h:06d}"
        whole = [False] * GPUS_PER_HOST
        milli = [0] * GPUS_PER_HOST
        util = [0.0] * GPUS_PER_HOST
        owner: list[str | None] = [None] * GPUS_PER_HOST  # whose shares a GPU carries
        vcpus_used = 0
        mem_used = 0
        if rng.random() < load * 1.6:
            # a few allocations on this host
            for _ in range(rng.randint(1, 3)):
                free = [i for i in range(GPUS_PER_HOST) if not whole[i] and milli[i] == 0]
                if not free:
                    break
                aid = f"run-{h}-{len(allocs)}"
                tenant = f"t{rng.randrange(N_TENANTS):03d}"
                prio: Priority = _pick(rng, classes)  # type: ignore[assignment]
                billing: Billing = "spot" if prio == "low" and rng.random() < 0.6 else "on_demand"
                started = -rng.uniform(60, 86400)
                end = rng.uniform(60, 36000) if rng.random() < 0.6 else None
                if rng.random() < 0.2:
                    i = free[0]
                    m = rng.choice((250, 500))
                    milli[i] += m
                    owner[i] = tenant
                    util[i] = rng.random()
                    place = HostPlacement(host_id, (f"{host_id}-g{i}",), m)
                    vc, mem = 4, 32 * 1024
                else:
                    g = min(len(free), rng.choice((1, 1, 2, 4)))
                    for i in free[:g]:
                        whole[i] = True
                        util[i] = rng.random()
                    place = HostPlacement(host_id, tuple(f"{host_id}-g{i}" for i in free[:g]))
                    vc, mem = 16 * g, 128 * 1024 * g
                vcpus_used += vc
                mem_used += mem
                kind: Kind = "job" if end is not None else "instance"
                allocs.append(
                    Allocation(
                        request_id=aid,
                        tenant_id=tenant,
                        placements=(place,),
                        gpu_model=model,
                        priority=prio,
                        billing=billing,
                        kind=kind,
                        started_at=started,
                        expected_end=end,
                        restartable=kind == "job",
                        vcpus=vc,
                        memory_mib=mem,
                    )
                )
        gviews = tuple(
            GpuView(
                uuid=f"{host_id}-g{i}",
                index=i,
                model=model,
                nvlink_island=i // island,
                numa_node=i // 4,
                whole=whole[i],
                used_milli=0 if whole[i] else milli[i],
                utilisation=util[i],
                idle_since=None if util[i] > 0.05 else -7200.0,
                share_tenant=owner[i],
            )
            for i in range(GPUS_PER_HOST)
        )
        hosts.append(
            HostView(
                host_id=host_id,
                region=region,
                ready=rng.random() > 0.01,
                gpus=gviews,
                free_vcpus=VCPUS_PER_HOST - vcpus_used,
                free_memory_mib=MEM_PER_HOST - mem_used,
                total_vcpus=VCPUS_PER_HOST,
                total_memory_mib=MEM_PER_HOST,
            )
        )
    tenants = tuple(
        TenantView(
            tenant_id=f"t{t:03d}",
            weight=float(1 + t % 3),
            quotas=(QuotaRule(max_gpus=64, gpu_model="H100"),) if t % 10 == 0 else (),
        )
        for t in range(N_TENANTS)
    )
    return ClusterSnapshot(hosts=tuple(hosts), allocations=tuple(allocs), tenants=tenants)


def synthetic_queue(n: int, seed: int = 0) -> tuple[PlacementRequest, ...]:
    """``n`` pending requests: 1-8 whole GPUs, fractional shares, a few 2-host
    gangs, many tenants, all classes, half pinned to a region."""
    rng = random.Random(seed + 1)
    shapes: dict[str, float] = {
        "1": 0.35,
        "2": 0.13,
        "4": 0.1,
        "8": 0.07,
        "125": 0.08,
        "250": 0.12,
        "500": 0.13,
        "2x8": 0.02,
    }
    models = {m: s for m, (s, _i) in MODELS.items()}
    classes: dict[str, float] = {"critical": 0.1, "standard": 0.6, "low": 0.3}
    out = []
    for j in range(n):
        shape = _pick(rng, shapes)
        nodes = 1
        if shape == "2x8":
            g, milli, nodes = 8, WHOLE, 2
        elif int(shape) <= 8:
            g, milli = int(shape), WHOLE
        else:
            g, milli = 0, int(shape)
        prio: Priority = _pick(rng, classes)  # type: ignore[assignment]
        kind: Kind = "job" if rng.random() < 0.6 else "instance"
        out.append(
            PlacementRequest(
                request_id=f"r{j:07d}",
                tenant_id=f"t{rng.randrange(N_TENANTS):03d}",
                gpu_model=_pick(rng, models),
                gpus_per_node=g,
                gpu_milli=milli,
                nodes=nodes,
                vcpus=16 * g if g else 4,
                memory_mib=(128 * g if g else 32) * 1024,
                region=rng.choice(REGIONS) if rng.random() < 0.5 else None,
                kind=kind,
                priority=prio,
                billing="spot" if prio == "low" and rng.random() < 0.5 else "on_demand",
                submitted_at=-rng.uniform(0, 3600),
                expected_duration=rng.uniform(300, 36000) if kind == "job" else None,
                attained_service=0.0,
                restartable=kind == "job",
            )
        )
    return tuple(out)


def run_core_bench(
    gpus: int,
    pending: int,
    seed: int = 0,
    policy: str | Policy = "gpucloud",
    *,
    trace_memory: bool = False,
) -> dict[str, Any]:
    """Build a fleet and a queue, time one ``plan()``, report throughput and memory.

    ``seconds`` is wall time; ``cpu_seconds`` is this process's CPU time, the
    figure to compare on a shared machine. ``trace_memory`` adds the peak of
    Python allocations made by ``plan()`` itself (tracemalloc; slows the run).
    """
    pol = get_policy(policy) if isinstance(policy, str) else policy
    t0 = time.perf_counter()
    snap = synthetic_fleet(gpus, seed)
    queue = synthetic_queue(pending, seed)
    built = time.perf_counter() - t0
    if trace_memory:
        tracemalloc.start()
    t1 = time.perf_counter()
    c1 = time.process_time()
    result = plan(snap, queue, pol, now=0.0)  # pauses the cyclic GC itself (core.gcpause)
    cpu = time.process_time() - c1
    seconds = time.perf_counter() - t1
    traced_peak = 0
    if trace_memory:
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    c = result.counters
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "policy": pol.name,
        "gpus": len(snap.hosts) * GPUS_PER_HOST,
        "hosts": len(snap.hosts),
        "running": len(snap.allocations),
        "pending": pending,
        "placements": c.placed,
        "waiting": c.waiting,
        "rejected": c.rejected,
        "preempted": c.preempted,
        "reclaimed": c.reclaimed,
        "hosts_examined": c.hosts_examined,
        "seconds": round(seconds, 4),
        "cpu_seconds": round(cpu, 4),
        "placements_per_s": round(c.placed / seconds) if seconds else 0,
        "placements_per_cpu_s": round(c.placed / cpu) if cpu else 0,
        "decisions_per_s": round(pending / seconds) if seconds else 0,
        "build_seconds": round(built, 3),
        "peak_rss_mib": round(rss_kib / 1024, 1),
        **({"plan_traced_peak_mib": round(traced_peak / 2**20, 1)} if trace_memory else {}),
    }


def main(argv: list[str]) -> None:
    gpus = int(argv[1]) if len(argv) > 1 else 100_000
    pending = int(argv[2]) if len(argv) > 2 else 50_000
    policy = argv[3] if len(argv) > 3 else "gpucloud"
    print(run_core_bench(gpus, pending, 0, policy, trace_memory="--trace" in argv))


if __name__ == "__main__":
    main(sys.argv)
