"""Hosts and GPUs as registered agents would leave them, for the scheduler's tests."""
from __future__ import annotations

import itertools

_seq = itertools.count()


def make_hosts(*, region: str = "us-east-1", n: int = 1, gpus: int = 8, model: str = "H100",
               islands: int = 2, vcpus: int = 224, memory_gib: int = 2048):
    from agents.models import Gpu, Host
    from gpucloud.catalogue.models import GpuModel, Region

    region_obj = Region.objects.get(code=region)
    gpu_model = GpuModel.objects.get(code=model)
    hosts, rows = [], []
    for _ in range(n):
        i = next(_seq)
        host = Host.objects.create(name=f"{model.lower()}-{region}-{i}", region=region_obj, vcpus=vcpus,
                                   memory_mib=memory_gib * 1024)
        hosts.append(host)
        per_island = max(1, gpus // islands)
        for g in range(gpus):
            rows.append(Gpu(uuid=f"GPU-{i:05d}-{g:02d}", host=host, index=g, gpu_model=gpu_model,
                            memory_mib=80 * 1024, nvlink_island=g // per_island, numa_node=g // per_island))
    Gpu.objects.bulk_create(rows)
    return hosts
