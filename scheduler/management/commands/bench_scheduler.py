"""Benchmark the scheduler: (a) the pure core, (b) full cycles against the database.

    python manage.py bench_scheduler --gpus 100000 --pending 50000 [--json]

(b) runs in a throwaway database (`test_<name>`, created and dropped here), on the
same synthetic fleet and queue as (a): hosts, GPUs, running work and pending
workloads are written as rows, then `run_cycle` runs region by region until the
queue stops moving. Its rate counts everything a live cycle does: loading the
snapshot, planning, the guarded writes and the commit.
"""
from __future__ import annotations

import json
import random
import resource
import time
import uuid
from collections import defaultdict
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from agents.models import Gpu, Host
from gpucloud.catalogue.models import GpuModel, InstanceType, Region
from gpucloud.lib.db import bench_database
from gpucloud.tenancy.models import Tenant
from scheduler.choices import State
from scheduler.core import bench
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Workload


def _rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class Command(BaseCommand):
    help = "Placements per second of the scheduler core and of full database cycles."

    def add_arguments(self, parser):
        parser.add_argument("--gpus", type=int, default=100_000)
        parser.add_argument("--pending", type=int, default=50_000)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--policy", default="gpucloud")
        parser.add_argument("--skip-db", action="store_true", help="only the pure core")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, gpus, pending, seed, policy, skip_db, **options):
        if gpus < 8 or pending < 1:
            raise CommandError("--gpus must be >= 8 and --pending >= 1")
        core = bench.run_core_bench(gpus, pending, seed, policy)
        out = {
            "gpus": core["gpus"], "pending": pending, "policy": policy,
            "core_placements": core["placements"], "core_seconds": core["seconds"],
            "core_placements_per_s": core["placements_per_s"],
        }
        if not skip_db:
            if connection.vendor != "postgresql":
                raise CommandError("the database benchmark needs PostgreSQL (set DATABASE_URL), or pass --skip-db")
            out.update(self._db_bench(gpus, pending, seed, policy))
        out["peak_rss_mib"] = _rss_mib()
        if options["json"]:
            self.stdout.write(json.dumps(out))
        else:
            for key, value in out.items():
                self.stdout.write(f"{key:>26}: {value}")

    def _db_bench(self, gpus: int, pending: int, seed: int, policy: str) -> dict:
        with bench_database():
            t0 = time.perf_counter()
            region_ids = _populate(gpus, pending, seed)
            populate_s = time.perf_counter() - t0
            with override_settings(SCHEDULER_POLICY=policy):
                return {"db_populate_seconds": round(populate_s, 1), **_cycles(region_ids)}


def _cycles(region_ids: list[int]) -> dict:
    placed = cycles = 0
    busy_s = 0.0  # wall time of the cycles that placed something
    spent = {"load": 0.0, "plan": 0.0, "apply": 0.0}
    t0 = time.perf_counter()
    for region_id in region_ids:
        for _ in range(10):  # until the region's queue stops moving
            c0 = time.perf_counter()
            stats = run_cycle(region_id=region_id)
            cycles += 1
            placed += stats.apply.placed
            spent["load"] += stats.load_s
            spent["plan"] += stats.plan_s
            spent["apply"] += stats.apply_s
            if stats.apply.placed == 0:
                break
            busy_s += time.perf_counter() - c0
    seconds = time.perf_counter() - t0
    return {
        "db_cycles": cycles, "db_placements": placed, "db_seconds": round(seconds, 2),
        # the drain rate: placements over the wall time of the cycles that placed work
        # (load + plan + guarded writes + commit); the last, idle cycle per region only
        # confirms nothing more fits and is reported in db_seconds
        "db_placements_per_s": round(placed / busy_s) if busy_s else 0,
        "db_load_seconds": round(spent["load"], 2), "db_plan_seconds": round(spent["plan"], 2),
        "db_apply_seconds": round(spent["apply"], 2),
    }


def _populate(gpus: int, pending: int, seed: int) -> list[int]:
    """Write the synthetic fleet, its running work and the queue as rows."""
    snap = bench.synthetic_fleet(gpus, seed)
    queue = bench.synthetic_queue(pending, seed)
    now = timezone.now()
    rng = random.Random(seed)
    regions = {code: Region.objects.create(code=code, name=code, country="US") for code in bench.REGIONS}
    models = {m: GpuModel.objects.create(code=m, name=m, vendor="nvidia", memory_gib=80, bf16_tflops=300,
                                         interconnect="NVLink") for m in bench.MODELS}
    types: dict[tuple[str, int, int], InstanceType] = {}

    def itype(model: str, g: int, milli: int) -> InstanceType:
        key = (model, max(g, 1), milli)
        if key not in types:
            types[key] = InstanceType.objects.create(
                code=f"{model.lower()}.{key[1]}x{milli}", name=str(key), gpu_model=models[model],
                gpu_count=key[1], gpu_share_milli=milli, vcpus=16 * g if g else 4,
                memory_gib=128 * g if g else 32, disk_gib=100)
        return types[key]

    tenants = {f"t{t:03d}": Tenant(name=f"t{t:03d}", slug=f"t{t:03d}", plan="enterprise",
                                   fair_share_weight=1 + t % 3) for t in range(bench.N_TENANTS)}
    Tenant.objects.bulk_create(tenants.values())
    host_pk = {h.host_id: uuid.uuid4() for h in snap.hosts}
    used = defaultdict(lambda: [0, 0])
    for a in snap.allocations:
        for p in a.placements:
            used[p.host_id][0] += a.vcpus
            used[p.host_id][1] += a.memory_mib
    Host.objects.bulk_create([
        Host(id=host_pk[h.host_id], name=h.host_id, region=regions[h.region],
             state="ready" if h.ready else "down", vcpus=h.total_vcpus, memory_mib=h.total_memory_mib,
             used_vcpus=used[h.host_id][0], used_memory_mib=used[h.host_id][1])
        for h in snap.hosts
    ], batch_size=5000)
    Gpu.objects.bulk_create([
        Gpu(uuid=g.uuid, host_id=host_pk[h.host_id], index=g.index, gpu_model=models[g.model],
            nvlink_island=g.nvlink_island, numa_node=g.numa_node, whole=g.whole,
            used_milli=1000 if g.whole else g.used_milli, utilisation=g.utilisation)
        for h in snap.hosts for g in h.gpus
    ], batch_size=5000)
    region_of = {h.host_id: h.region for h in snap.hosts}
    running, allocations = [], []
    for a in snap.allocations:
        p = a.placements[0]
        wid = uuid.uuid4()
        milli = p.milli
        running.append(Workload(
            id=wid, tenant=tenants[a.tenant_id], kind=a.kind, name=a.request_id,
            instance_type=itype(a.gpu_model, len(p.gpus) if milli == 1000 else 0, milli),
            region=regions[region_of[p.host_id]], image="bench", priority=a.priority, billing=a.billing,
            state=State.RUNNING, started_at=now + timedelta(seconds=a.started_at)))
        for i, g in enumerate(p.gpus):
            allocations.append(Allocation(gpu_id=g, host_id=host_pk[p.host_id], workload_id=wid, milli=milli,
                                          vcpus=a.vcpus if i == 0 else 0, memory_mib=a.memory_mib if i == 0 else 0))
    Workload.objects.bulk_create(running, batch_size=5000)
    Allocation.objects.bulk_create(allocations, batch_size=5000)
    Workload.objects.bulk_create([
        Workload(tenant=tenants[r.tenant_id], kind="job" if r.nodes > 1 else r.kind, name=r.request_id,
                 instance_type=itype(r.gpu_model, r.gpus_per_node, r.gpu_milli),
                 region=regions[r.region or rng.choice(bench.REGIONS)], image="bench", priority=r.priority,
                 billing=r.billing, nodes=r.nodes, queued_at=now + timedelta(seconds=r.submitted_at),
                 timeout_s=int(r.expected_duration) if r.expected_duration else None)
        for r in queue
    ], batch_size=5000)
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    return [r.pk for r in regions.values()]
