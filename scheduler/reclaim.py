"""Reclamation: allocations whose workload no longer holds GPUs are freed and counted.

Every terminal transition releases its allocations in the same transaction, so
this finds nothing in a healthy system; it is the safety net for rows written by
hand, restored backups or bugs, and it says so in the log when it frees anything.
"""
from __future__ import annotations

import logging
from collections import defaultdict

from django.db import transaction
from django.db.models import Sum

from agents.models import Gpu
from scheduler.choices import HOLDING
from scheduler.models import Allocation
from scheduler.services import release_allocations

logger = logging.getLogger(__name__)


@transaction.atomic
def allocations_audit() -> dict[str, int]:
    stale = list(
        Allocation.objects.filter(active=True).exclude(workload__state__in=HOLDING)
        .order_by().values_list("workload_id", flat=True).distinct()
    )
    freed = release_allocations(workload_ids=stale) if stale else 0
    # GPU booking counters must equal the sum of active allocations; repair drift.
    booked = defaultdict(int, Allocation.objects.filter(active=True).values("gpu_id")
                         .annotate(m=Sum("milli")).values_list("gpu_id", "m"))
    drift = 0
    for uuid, whole, used in Gpu.objects.filter(used_milli__gt=0).values_list("uuid", "whole", "used_milli"):
        if booked[uuid] != used:
            Gpu.objects.filter(uuid=uuid).update(used_milli=booked[uuid], whole=whole and booked[uuid] == 1000)
            drift += 1
    if freed or drift:
        logger.warning("allocation audit freed=%d workloads=%d gpu_drift=%d", freed, len(stale), drift)
    return {"freed_allocations": freed, "workloads": len(stale), "gpu_drift": drift}
