from __future__ import annotations

import logging
import time

from celery import shared_task

from agents.fastpath import heartbeats_flush
from agents.services.gpus import gpu_samples_rollup
from agents.services.liveness import hosts_check_liveness

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=30, time_limit=60)
def hosts_liveness_task() -> dict[str, int]:
    """Every few seconds (beat): silent hosts go DOWN; work on long-DOWN hosts becomes LOST."""
    t0 = time.perf_counter()
    outcome = hosts_check_liveness()
    stats = {"down": len(outcome.down), "lost": len(outcome.lost)}
    level = logging.WARNING if outcome.down or outcome.lost else logging.DEBUG
    logger.log(
        level,
        "hosts liveness down=%s lost=%s duration_ms=%.1f",
        outcome.down,
        outcome.lost,
        (time.perf_counter() - t0) * 1000,
    )
    return stats


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def gpu_samples_rollup_task() -> dict[str, int]:
    """Every minute (beat): raw GPU samples -> 1-minute averages; both pruned."""
    t0 = time.perf_counter()
    out = gpu_samples_rollup()
    logger.info(
        "gpu samples rollup minutes=%d raw_pruned=%d minutes_pruned=%d duration_ms=%.1f",
        out.minutes,
        out.raw_pruned,
        out.minutes_pruned,
        (time.perf_counter() - t0) * 1000,
    )
    return {"minutes": out.minutes, "raw_pruned": out.raw_pruned,
            "minutes_pruned": out.minutes_pruned}


@shared_task(ignore_result=True, soft_time_limit=20, time_limit=30)
def heartbeats_flush_task() -> dict[str, int]:
    """Every second (beat): heartbeats the fast path answered -> samples, GPUs, hosts."""
    t0 = time.perf_counter()
    out = heartbeats_flush()
    if out.heartbeats:
        logger.debug(
            "heartbeats flush heartbeats=%d samples=%d gpus=%d hosts=%d duration_ms=%.1f",
            out.heartbeats, out.samples, out.gpus, out.hosts, (time.perf_counter() - t0) * 1000,
        )
    return {"heartbeats": out.heartbeats, "samples": out.samples}
